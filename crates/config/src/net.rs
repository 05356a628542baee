//! The addresses and networks a configuration names: where nodes started without an
//! address listen (`transport.interface`) and which front-ends a stream takes connections
//! from (`source.allow_from`).

/// `transport.interface`: where nodes started without an address listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interface {
    /// A network interface by name ("ib0", "eth1").
    Name(String),
    /// One address of this host.
    Addr(std::net::IpAddr),
    /// This host's address inside a network ("10.1.0.0/16").
    Net(std::net::IpAddr, u8),
}

impl Interface {
    pub fn parse(s: &str) -> Result<Interface, String> {
        if let Some((ip, len)) = s.split_once('/') {
            let ip: std::net::IpAddr = ip
                .parse()
                .map_err(|_| format!("{s:?}: {ip:?} is not an IP address"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let len: u8 = len
                .parse()
                .ok()
                .filter(|l| *l <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?;
            return Ok(Interface::Net(ip, len));
        }
        if let Ok(ip) = s.parse() {
            return Ok(Interface::Addr(ip));
        }
        // Linux interface names: 1 to 15 bytes, no '/', no white space
        let ok = (1..=15).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:@".contains(&b));
        if ok {
            Ok(Interface::Name(s.to_string()))
        } else {
            Err(format!(
                "{s:?} is neither an interface name (1 to 15 letters, digits, - _ . : @), an IP \
                 address, nor a network such as \"10.1.0.0/16\""
            ))
        }
    }

    /// Whether `ip` lies in this network (`Net`) or is this address (`Addr`).
    pub fn holds(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        match (self, ip) {
            (Interface::Addr(a), _) => *a == ip,
            (Interface::Net(IpAddr::V4(n), len), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - *len as u32).unwrap_or(0);
                u32::from(*n) & mask == u32::from(a) & mask
            }
            (Interface::Net(IpAddr::V6(n), len), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - *len as u32).unwrap_or(0);
                u128::from(*n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// One entry of `source.allow_from`: an address and how many leading bits of it must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllowedNet {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl AllowedNet {
    /// `"10.0.0.7"` (that address) or `"10.0.0.0/24"` (a network); IPv6 alike.
    pub fn parse(s: &str) -> Result<AllowedNet, String> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => (ip, Some(p)),
            None => (s, None),
        };
        let addr: std::net::IpAddr = ip
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or IP/prefix network"))?;
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.trim().parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(format!("{s:?}: the prefix must be 0 ..= {max}")),
            },
        };
        Ok(AllowedNet { addr, prefix })
    }

    /// Whether `ip` is in this network (an IPv4 address written as IPv6, `::ffff:a.b.c.d`,
    /// counts as IPv4).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let bits = |a: std::net::IpAddr| -> u128 {
            match a {
                std::net::IpAddr::V4(v) => u32::from(v) as u128,
                std::net::IpAddr::V6(v) => u128::from(v),
            }
        };
        let ip = ip.to_canonical();
        if ip.is_ipv4() != self.addr.is_ipv4() {
            return false;
        }
        let width = if ip.is_ipv4() { 32 } else { 128 };
        let shift = width - u32::from(self.prefix);
        if shift >= 128 {
            return true;
        }
        (bits(ip) >> shift) == (bits(self.addr) >> shift)
    }
}

impl std::fmt::Display for AllowedNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let max = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == max {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}
