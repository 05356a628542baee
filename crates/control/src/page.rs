//! The run page served by the EVM at `/`: plain HTML and JavaScript inside the binary (no
//! CDN, no build step), polling `GET /api/v1/status` once a second.

pub const PAGE: &str = include_str!("page.html");
