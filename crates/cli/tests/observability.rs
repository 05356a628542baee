//! Watching a run with the real tools: `promtool check metrics` on every node's /metrics, a
//! real Prometheus server scraping a running system (and every query of the Grafana
//! dashboard evaluated by it), and the run page in headless Chromium driven through
//! chromedriver: the table fills with changing numbers, and its Stop button ends the run.
//!
//! The tools come from Debian (scripts/test.sh installs them; EVB_REQUIRE_TOOLS=1 makes a
//! missing one a failure instead of a skip).

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::up::Up;
use evb_control::client::Api;
use serde_json::{json, Value};

/// A tool from PATH or from the folder scripts/test.sh unpacks Debian's prometheus into.
fn tool(name: &str) -> Option<PathBuf> {
    let unpacked = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/tools/prometheus/usr/bin")
        .join(name);
    if unpacked.exists() {
        return Some(unpacked);
    }
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    (found.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
}

/// The tool, or a skip (a failure when CI requires the tools).
fn need(name: &str) -> Option<PathBuf> {
    let t = tool(name);
    if t.is_none() {
        assert!(
            std::env::var("EVB_REQUIRE_TOOLS").is_err(),
            "{name} is required (EVB_REQUIRE_TOOLS) but not installed"
        );
        evb_buffers::skips::skipped(name, "not installed (scripts/test.sh installs it)");
    }
    t
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A run that lasts while the test watches it.
const LONG: &str =
    "[run]\nevents = 0\nduration_s = 120\nrate_hz = 20000\n[fragments]\nsize = 4096\n";

#[test]
fn promtool_passes_every_nodes_metrics_and_prometheus_scrapes_a_running_system() {
    let (Some(promtool), Some(prometheus)) = (need("promtool"), need("prometheus")) else {
        return;
    };
    let up = Up::start(LONG);
    assert_eq!(up.post("start", json!({})).0, 200);
    up.wait_until("run 1 building", 30, |s| {
        s["state"] == "running" && s["totals"]["events_built"].as_u64().unwrap_or(0) > 0
    });
    let nodes: Vec<String> = up.status()["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["control"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(nodes.len(), 5);
    for addr in &nodes {
        let text = Api::new(addr, None).get("/metrics").unwrap().body;
        let text = text.as_str().unwrap().to_string();
        assert!(text.contains("evb_run_state"), "{text}");
        let mut check = Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        check
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = check.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics failed for {addr}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // a real Prometheus server scraping every node each second, finding them through the
    // EVM's service discovery endpoint (the configuration docs/operations/running.md shows)
    let sd = Api::new(&nodes[0], None).get("/api/v1/sd").unwrap();
    assert!(sd.ok(), "{:?}", sd.body);
    let mut found: Vec<String> = sd
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["targets"][0].as_str().unwrap().to_string())
        .collect();
    found.sort();
    let mut want = nodes.clone();
    want.sort();
    assert_eq!(
        found, want,
        "service discovery lists every node's API: {}",
        sd.body
    );
    let dir = common::out_dir();
    let conf = dir.path().join("prometheus.yml");
    std::fs::write(
        &conf,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: evb\n    honor_labels: true\n    http_sd_configs:\n      - url: http://{}/api/v1/sd\n        refresh_interval: 5s\n",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/prometheus-alerts.yml"),
            nodes[0]
        ),
    )
    .unwrap();
    let port = evb_messaging::free_ports(1).expect("a free loopback port");
    let _server = Kill(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", conf.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let prom = Api::new(&format!("127.0.0.1:{port}"), None);
    let query = |q: &str| -> Value {
        let enc: String = q
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        prom.get(&format!("/api/v1/query?query={enc}"))
            .map(|r| r.body)
            .unwrap_or(Value::Null)
    };
    let built = || -> Option<f64> {
        let v = query("sum(evb_events_built_total)");
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    };
    let until = Instant::now() + Duration::from_secs(60);
    let first = loop {
        if let Some(v) = built().filter(|v| *v > 0.0) {
            break v;
        }
        assert!(Instant::now() < until, "Prometheus never scraped evb");
        std::thread::sleep(Duration::from_millis(250));
    };
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let now = built().unwrap_or(0.0);
        if now > first {
            eprintln!("evb_events_built_total rose from {first} to {now} in Prometheus");
            break;
        }
        assert!(
            Instant::now() < until,
            "evb_events_built_total did not rise"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // every node is up as a target, and every query of the Grafana dashboard evaluates
    // (targets are scraped at staggered moments: wait for a round with every one)
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let up_targets = query("sum(up{job=\"evb\"})");
        // the labels come from the service discovery: 2 BUs of role bu
        let bus = query("count(up{job=\"evb\",role=\"bu\"})");
        if up_targets["data"]["result"][0]["value"][1] == "5"
            && bus["data"]["result"][0]["value"][1] == "2"
        {
            break;
        }
        assert!(
            Instant::now() < until,
            "not every node is up in Prometheus: {up_targets}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // the node's own `node` and `role` labels and the discovery's agree (honor_labels): no
    // series carries them twice as `exported_node`, `exported_role` (issue 71 item 6)
    let twice = query("count({job=\"evb\", exported_node=~\".+\"})");
    assert_eq!(twice["data"]["result"], json!([]), "{twice}");
    let twice = query("count({job=\"evb\", exported_role=~\".+\"})");
    assert_eq!(twice["data"]["result"], json!([]), "{twice}");
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/grafana-dashboard.json"
        ))
        .unwrap(),
    )
    .unwrap();
    // every query of the dashboard, with what a clean running run of 2 RUs and 2 BUs must
    // give: how many series (None: at least one) and what each value must be. A query that
    // answers nothing, or the wrong thing, fails; a new panel needs its line here.
    type Check = fn(&Value, f64) -> bool;
    let any: Check = |_, v| v >= 0.0;
    // (NaN, what a rate without two samples gives, is not)
    let positive: Check = |_, v| v > 0.0;
    let want: &[(&str, Option<usize>, Check)] = &[
        ("max(evb_run_number{role=\"evm\"})", Some(1), |_, v| v == 1.0),
        ("evb_run_state{role=\"evm\"} == 1", Some(1), |m, v| {
            m["state"] == "running" && v == 1.0
        }),
        ("sum(rate(evb_events_built_total[30s]))", Some(1), positive),
        ("sum(rate(evb_event_payload_built_bytes_total[30s]))", Some(1), positive),
        ("sum(evb_events_in_flight)", Some(1), any),
        ("sum(evb_nodes_down)", Some(1), |_, v| v == 0.0),
        ("rate(evb_events_built_total[30s])", Some(2), |m, v| {
            m["role"] == "bu" && v > 0.0
        }),
        ("rate(evb_event_payload_built_bytes_total[30s])", Some(2), |m, v| {
            m["role"] == "bu" && v > 0.0
        }),
        ("rate(evb_fragment_payload_sent_bytes_total[30s])", Some(2), |m, v| {
            m["role"] == "ru" && v > 0.0
        }),
        ("histogram_quantile(0.5, sum by (le) (rate(evb_event_build_latency_seconds_bucket[1m])))", Some(1), positive),
        ("histogram_quantile(0.99, sum by (le) (rate(evb_event_build_latency_seconds_bucket[1m])))", Some(1), positive),
        ("histogram_quantile(0.999, sum by (le) (rate(evb_event_build_latency_seconds_bucket[1m])))", Some(1), positive),
        ("evb_credits_available", Some(1), any),
        ("evb_sink_queued_events", Some(2), |m, v| m["role"] == "bu" && v >= 0.0),
        ("rate(evb_pool_exhausted_total[1m])", None, any),
        // a clean run has no errors: this panel shows nothing
        ("sum by (node, kind) (rate(evb_errors_total[1m])) > 0", Some(0), |_, _| false),
        ("evb_pool_blocks_in_use / evb_pool_blocks", None, |_, v| (0.0..=1.0).contains(&v)),
        ("evb_peer_send_queue_bytes", None, any),
    ];
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    let mut listed: Vec<&str> = want.iter().map(|w| w.0).collect();
    listed.sort();
    let mut on_dashboard: Vec<&str> = exprs.iter().map(String::as_str).collect();
    on_dashboard.sort();
    on_dashboard.dedup();
    assert_eq!(
        on_dashboard, listed,
        "the dashboard's queries and this test's expectations differ"
    );
    // rates need two scrapes of every target in their window: ask again until each query
    // gives what it must (or 30 s pass)
    let judge = |expr: &str, series: Option<usize>, ok: Check| -> Result<usize, String> {
        let r = query(expr);
        if r["status"] != "success" {
            return Err(format!("{r}"));
        }
        let result = r["data"]["result"].as_array().cloned().unwrap_or_default();
        let count_ok = match series {
            Some(n) => result.len() == n,
            None => !result.is_empty(),
        };
        if !count_ok {
            return Err(format!("{} series: {r}", result.len()));
        }
        for x in &result {
            let v: f64 = x["value"][1]
                .as_str()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("no value in {x}"))?;
            if !ok(&x["metric"], v) {
                return Err(format!("wrong value {v} for {}: {r}", x["metric"]));
            }
        }
        Ok(result.len())
    };
    let until = Instant::now() + Duration::from_secs(30);
    for (expr, series, ok) in want {
        loop {
            match judge(expr, *series, *ok) {
                Ok(n) => {
                    eprintln!("dashboard query {expr:?}: {n} series as expected");
                    break;
                }
                Err(e) => {
                    assert!(Instant::now() < until, "dashboard query {expr:?}: {e}");
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        }
    }
    // the alert rules (docs/prometheus-alerts.yml) evaluate against the real series, and a
    // clean running run fires none of them
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let r = prom
            .get("/api/v1/rules")
            .map(|r| r.body)
            .unwrap_or(Value::Null);
        let rules: Vec<Value> = r["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = rules.len() == 9
            && rules
                .iter()
                .all(|x| x["health"] == "ok" && x["lastEvaluation"] != "0001-01-01T00:00:00Z");
        if evaluated {
            let firing: Vec<&Value> = rules.iter().filter(|x| x["state"] != "inactive").collect();
            assert!(firing.is_empty(), "alerts on a clean run: {firing:?}");
            eprintln!("the 9 alert rules evaluate against the run's series; none fires");
            break;
        }
        assert!(Instant::now() < until, "alert rules not evaluated: {r}");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(up.ctl(&["stop"]).status.success());
    assert_eq!(up.wait_run(1)["ok"], true);
    assert!(up.halt().success());
}

/// The alert rules (docs/prometheus-alerts.yml) pass `promtool check rules`, and
/// `promtool test rules` fires each on its cause and not on what merely resembles it
/// (crates/cli/tests/prometheus/alerts-test.yml).
#[test]
fn the_alert_rules_check_and_fire_on_their_causes() {
    let Some(promtool) = need("promtool") else {
        return;
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let check = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(root.join("../../docs/prometheus-alerts.yml"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && said.contains("SUCCESS: 9 rules found"),
        "{said}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let test = Command::new(&promtool)
        .args(["test", "rules", "alerts-test.yml"])
        .current_dir(root.join("tests/prometheus"))
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
}

/// With a secret, the page opened once with the token (the URL `evb up` prints) keeps a
/// session of its own for its tab and port, not the token, and no cookie; its buttons start
/// and stop a run with that session (issue 53 item 2).
#[test]
fn the_run_page_of_a_run_with_a_secret_commands_with_its_own_session() {
    let (Some(chromium), Some(chromedriver)) = (need("chromium"), need("chromedriver")) else {
        return;
    };
    let up = Up::start(
        "[run]\nsecret = \"page-door-key-81c4\"\nevents = 0\nduration_s = 120\nrate_hz = 2000\n[fragments]\nsize = 4096\n",
    );
    let token = evb_control::control_token(b"page-door-key-81c4");
    let b = Browser::start(&chromedriver, &chromium);
    b.post("/url", json!({"url": format!("{}?token={token}", up.url)}));
    let until = Instant::now() + Duration::from_secs(20);
    let seen = loop {
        let v = b.eval(
            "return {href: location.href, session: sessionStorage.getItem('evb_session'), \
             cookie: document.cookie};",
        );
        if v["session"].is_string() {
            break v;
        }
        assert!(Instant::now() < until, "the page kept no session: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let session = seen["session"].as_str().unwrap();
    assert_eq!(session.len(), 64, "{seen}");
    assert_ne!(session, token);
    let href = seen["href"].as_str().unwrap();
    assert!(
        !href.contains("token") && !href.contains("session"),
        "the address still holds a credential: {href}"
    );
    assert!(
        !seen["cookie"].as_str().unwrap_or("").contains(&token),
        "{seen}"
    );
    b.click("#btn-start");
    up.wait_until("run 1 building", 30, |s| {
        s["state"] == "running" && s["totals"]["events_built"].as_u64().unwrap_or(0) > 0
    });
    // Reset of a live run asks first, as Halt does: answered no, nothing is sent and the run
    // goes on (once the page itself shows the run under way)
    let until = Instant::now() + Duration::from_secs(10);
    while b.eval("return document.getElementById('state').textContent;") != "running" {
        assert!(Instant::now() < until, "the page never showed the run");
        std::thread::sleep(Duration::from_millis(100));
    }
    b.eval(
        "window.asked = 0; window.confirm = () => { window.asked += 1; return false; }; return 0;",
    );
    b.click("#btn-reset");
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(b.eval("return window.asked;"), 1, "Reset did not ask");
    assert_eq!(up.status()["state"], "running", "Reset acted without a yes");
    b.click("#btn-stop");
    let rec = up.wait_run(1);
    assert_eq!(rec["ok"], true, "{rec:#}");
    assert_eq!(rec["report"]["run"]["evm"]["stopped_by_request"], true);
    assert!(up.halt().success());
}

/// Issue 69: the page's BU buttons. A spare's row has Add: pressed, `evb up` starts the
/// spare and it joins the run under way. A building BU's row has Retire, which asks first:
/// answered yes, that BU retires. The run stays exact.
#[test]
fn the_run_page_adds_a_spare_bu_and_retires_a_bu() {
    let (Some(chromium), Some(chromedriver)) = (need("chromium"), need("chromedriver")) else {
        return;
    };
    let up = Up::start(
        "[run]\nevents = 0\nduration_s = 120\nrate_hz = 2000\n[fragments]\nsize = 4096\n\
         [topology]\nspare_bus = 1\n",
    );
    assert_eq!(up.post("start", json!({})).0, 200);
    up.wait_until("run 1 building", 30, |s| {
        s["state"] == "running" && s["totals"]["events_built"].as_u64().unwrap_or(0) > 0
    });
    let b = Browser::start(&chromedriver, &chromium);
    b.post("/url", json!({"url": up.url}));
    let button =
        |bu: &str, act: &str| format!("#nodes tr[data-node='{bu}'] button[data-act='{act}']");
    let until = Instant::now() + Duration::from_secs(20);
    let has = |sel: &str| {
        b.eval(&format!(
            "return document.querySelector(\"{sel}\") !== null;"
        ))
    };
    while has(&button("bu2", "add-bu")) != true || has(&button("bu1", "retire")) != true {
        assert!(
            Instant::now() < until,
            "no Add on the spare's row or Retire on bu1's"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        has(&button("bu0", "add-bu")),
        false,
        "Add on a BU that is no spare"
    );
    // the table is rebuilt at every refresh: a WebDriver element found before it may be
    // gone by its click, so the page clicks the row's current button itself
    let press = |sel: &str| {
        b.eval(&format!(
            "const e = document.querySelector(\"{sel}\"); if (e) e.click(); return e !== null;"
        ))
    };
    assert_eq!(press(&button("bu2", "add-bu")), true);
    let s = up.wait_until("bu2 joined", 60, |s| {
        s["evm"]["lost"].as_array().is_some_and(|l| {
            l.iter()
                .any(|e| e["node"] == "bu[2]" && e["kind"] == "joined")
        })
    });
    assert_eq!(s["state"], "running", "{s:#}");
    b.eval("window.confirm = () => true; return 0;");
    assert_eq!(press(&button("bu1", "retire")), true);
    up.wait_until("bu1 retiring", 30, |s| {
        s["evm"]["lost"].as_array().is_some_and(|l| {
            l.iter()
                .any(|e| e["node"] == "bu[1]" && e["kind"] == "retiring")
        })
    });
    assert!(up.ctl(&["stop"]).status.success());
    let rec = up.wait_run(1);
    assert_eq!(rec["ok"], true, "{rec:#}");
    assert_eq!(rec["events_built"], rec["triggered"], "{rec:#}");
    assert!(
        rec["report"]["run"]["bus"][2]["events_built"]
            .as_u64()
            .unwrap_or(0)
            > 0,
        "the added spare built nothing: {rec:#}"
    );
    assert!(up.halt().success());
}

/// A minimal WebDriver client (the W3C protocol over HTTP) for chromedriver.
struct Browser {
    api: Api,
    session: String,
    _driver: Kill,
    /// Chromium's profile folder, removed once the driver is gone (it lives in /dev/shm).
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start(chromedriver: &PathBuf, chromium: &PathBuf) -> Browser {
        let port = evb_messaging::free_ports(1).expect("a free loopback port");
        let driver = Kill(
            Command::new(chromedriver)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let api =
            Api::new(&format!("127.0.0.1:{port}"), None).with_timeout(Duration::from_secs(60));
        let until = Instant::now() + Duration::from_secs(20);
        while !api
            .get("/status")
            .is_ok_and(|r| r.body["value"]["ready"] == true)
        {
            assert!(Instant::now() < until, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile_dir = common::out_dir();
        let profile = profile_dir.path().to_path_buf();
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            &format!("--user-data-dir={}", profile.display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args}
        }}});
        let r = api.post("/session", &caps).unwrap();
        let session = r.body["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {:?}", r.body))
            .to_string();
        Browser {
            api,
            session,
            _driver: driver,
            _profile: profile_dir,
        }
    }

    fn post(&self, path: &str, body: Value) -> Value {
        let r = self
            .api
            .post(&format!("/session/{}{path}", self.session), &body)
            .unwrap();
        assert!(r.ok(), "{path}: {:?}", r.body);
        r.body["value"].clone()
    }

    fn eval(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({"script": script, "args": []}))
    }

    fn click(&self, css: &str) {
        let el = self.post("/element", json!({"using": "css selector", "value": css}));
        let id = el["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .unwrap()
            .to_string();
        self.post(&format!("/element/{id}/click"), json!({}));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.api.delete(&format!("/session/{}", self.session));
    }
}

#[test]
fn the_run_page_shows_live_numbers_and_its_stop_button_ends_the_run() {
    let (Some(chromium), Some(chromedriver)) = (need("chromium"), need("chromedriver")) else {
        return;
    };
    let up = Up::start(LONG);
    assert_eq!(up.post("start", json!({})).0, 200);
    up.wait_until("run 1 building", 30, |s| {
        s["state"] == "running" && s["totals"]["events_built"].as_u64().unwrap_or(0) > 0
    });
    // the controller keeps the run's rates: a page opened a few seconds into the run shows
    // them from before it was opened
    let hist_until = Instant::now() + Duration::from_secs(20);
    loop {
        let h = up.api.get("/api/v1/history").unwrap().body;
        let rates = h["totals"]["rate_hz"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if h["run"] == 1
            && rates
                .iter()
                .filter(|r| r.as_f64().unwrap_or(0.0) > 0.0)
                .count()
                >= 2
        {
            break;
        }
        assert!(Instant::now() < hist_until, "no rate history kept: {h}");
        std::thread::sleep(Duration::from_millis(250));
    }
    for bad in ["yesterday", "NaN", "%ff"] {
        let r = up.api.get(&format!("/api/v1/history?since={bad}")).unwrap();
        assert_eq!(r.status, 400, "{bad}: {:?}", r.body);
        assert!(r.body["error"].as_str().is_some(), "{bad}: {:?}", r.body);
    }
    let b = Browser::start(&chromedriver, &chromium);
    b.post("/url", json!({"url": up.url}));
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let v = b.eval(
            "const h = window.evbHistory, opened = performance.timeOrigin / 1000; \
             const before = h.t.map((t, i) => [t, h.rate[i]]).filter(p => p[0] < opened - 0.5); \
             return {run: h.run, started: h.started, n: h.t.length, first: h.t[0], opened, \
               before: before.length, busyBefore: before.filter(p => p[1] > 0).length, \
               points: document.getElementById('plot-rate').dataset.points, \
               yticks: document.getElementById('plot-rate').dataset.yticks || '', \
               xspan: Number(document.getElementById('plot-rate').dataset.xspan)};",
        );
        let yticks = v["yticks"].as_str().unwrap_or("").split(' ').count();
        if v["busyBefore"].as_u64().unwrap_or(0) >= 2
            && v["points"].as_str().and_then(|p| p.parse::<u64>().ok()) == v["n"].as_u64()
            && yticks >= 3
        {
            eprintln!("page history: {v}");
            assert_eq!(v["run"], 1);
            assert!(
                v["first"].as_f64().unwrap() >= v["started"].as_f64().unwrap(),
                "{v}"
            );
            // the x axis spans the run (seconds old), not a 300 s window
            let span = v["xspan"].as_f64().unwrap_or(0.0);
            assert!((10.0..60.0).contains(&span), "{v}");
            break;
        }
        assert!(
            Instant::now() < until,
            "the page did not show the rates from before it was opened: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // the table: one row per node; the BUs' event counts and the rate change while it runs
    let read = || -> Value {
        b.eval(
            "return {state: document.getElementById('state').textContent, \
             run: document.getElementById('run').textContent, \
             rows: Array.from(document.querySelectorAll('#nodes tbody tr')).map(r => \
               Array.from(r.cells).map(c => c.textContent)), \
             summary: document.getElementById('summary').textContent, \
             stopEnabled: !document.getElementById('btn-stop').disabled};",
        )
    };
    let until = Instant::now() + Duration::from_secs(20);
    let first = loop {
        let v = read();
        if v["rows"].as_array().is_some_and(|r| r.len() == 5) && v["state"] == "running" {
            break v;
        }
        assert!(
            Instant::now() < until,
            "the page never showed the running system: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let bu_events = |v: &Value| -> u64 {
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r[1] == "bu")
            .map(|r| r[3].as_str().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    let until = Instant::now() + Duration::from_secs(20);
    let later = loop {
        std::thread::sleep(Duration::from_millis(500));
        let v = read();
        let rate: f64 = v["rows"][3][4]
            .as_str()
            .unwrap_or("0")
            .parse()
            .unwrap_or(0.0);
        if bu_events(&v) > bu_events(&first) && rate > 0.0 {
            break v;
        }
        assert!(
            Instant::now() < until,
            "the page's numbers did not change: {first} then {v}"
        );
    };
    eprintln!("page: {} then {}", first["summary"], later["summary"]);
    // one number per idea on the page too: the summary's events built and rate are the EVM
    // row's (both drawn from one status reply)
    for v in [&first, &later] {
        let evm_row = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r[1] == "evm")
            .cloned()
            .unwrap_or_default();
        let summary = v["summary"].as_str().unwrap_or("");
        let (events, rate) = (
            evm_row[3].as_str().unwrap_or("?"),
            evm_row[4].as_str().unwrap_or("?"),
        );
        assert!(
            summary.starts_with(&format!("built {events} events · {rate} ev/s")),
            "{summary} against the EVM row {evm_row}"
        );
    }
    // every node's row has its rate over the run so far, from the server's history
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let sparks = b.eval(
            "return Array.from(document.querySelectorAll('#nodes tbody tr')).map(r => { \
               const s = r.querySelector('td.spark svg'); \
               return s ? Number(s.dataset.points) : 0; });",
        );
        let points: Vec<u64> = sparks
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap_or(0))
            .collect();
        if points.len() == 5 && points.iter().all(|&p| p >= 2) {
            break;
        }
        assert!(
            Instant::now() < until,
            "not every node row has its rate history: {points:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // the build latency: the BUs' histograms added up, served and drawn as bars
    let lat = up.status()["latency"].clone();
    let counts: Vec<u64> = lat["counts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(
        counts.len(),
        lat["bounds_us"].as_array().unwrap().len() + 1,
        "{lat}"
    );
    assert!(lat["count"].as_u64().unwrap() > 0, "{lat}");
    assert_eq!(
        counts.iter().sum::<u64>(),
        lat["count"].as_u64().unwrap(),
        "{lat}"
    );
    assert_eq!(lat["bus"], 2, "{lat}");
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let v = b.eval(
            "const c = document.getElementById('plot-latency'); \
             return {bars: Number(c.dataset.bars || 0), buckets: Number(c.dataset.buckets || 0), \
               count: Number(c.dataset.count || 0)};",
        );
        if v["bars"].as_u64().unwrap_or(0) >= 1
            && v["buckets"] == counts.len()
            && v["count"].as_u64().unwrap_or(0) > 0
        {
            eprintln!("page latency: {v}");
            break;
        }
        assert!(
            Instant::now() < until,
            "the page shows no build latency: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // the RU→BU matrix: a cell per link of the 2 × 2 system, each with bytes sent
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let v = b.eval(
            "return Array.from(document.querySelectorAll('#links td.link')).map(c => \
               [c.dataset.ru, c.dataset.bu, Number(c.dataset.bytes), Number(c.dataset.rate)]);",
        );
        let cells = v.as_array().cloned().unwrap_or_default();
        let mut links: Vec<String> = cells
            .iter()
            .filter(|c| c[2].as_f64().unwrap_or(0.0) > 0.0)
            .map(|c| {
                format!(
                    "{}>{}",
                    c[0].as_str().unwrap_or(""),
                    c[1].as_str().unwrap_or("")
                )
            })
            .collect();
        links.sort();
        if cells.len() == 4 && links == ["ru0>bu0", "ru0>bu1", "ru1>bu0", "ru1>bu1"] {
            eprintln!("page links: {v}");
            break;
        }
        assert!(
            Instant::now() < until,
            "the page's RU→BU matrix is not 2 × 2 with bytes on every link: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let m = up.api.get("/api/v1/links").unwrap().body;
    let sent: u64 = m["bytes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|b| b.as_u64().unwrap()))
        .sum();
    assert!(sent > 0, "{m}");
    assert_eq!(later["run"], "1");
    assert_eq!(later["stopEnabled"], true);
    // pressing Stop in the page ends the run, drained and exact
    b.click("#btn-stop");
    let rec = up.wait_run(1);
    assert_eq!(rec["ok"], true, "{rec:#}");
    assert_eq!(rec["report"]["run"]["evm"]["stopped_by_request"], true);
    assert_eq!(rec["events_built"], rec["triggered"]);
    let until = Instant::now() + Duration::from_secs(10);
    while read()["state"] != "ready" {
        assert!(
            Instant::now() < until,
            "the page did not show the run's end"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // between runs the page keeps the last run: its history, its latency, and the bytes
    // of every link
    let v = b.eval(
        "return {run: window.evbHistory.run, n: window.evbHistory.t.length, \
           busy: window.evbHistory.rate.filter(r => r > 0).length, \
           bars: Number(document.getElementById('plot-latency').dataset.bars || 0), \
           links: Array.from(document.querySelectorAll('#links td.link')) \
             .filter(c => Number(c.dataset.bytes) > 0).length, \
           note: document.getElementById('links-note').textContent};",
    );
    assert_eq!(v["run"], 1, "{v}");
    assert!(v["busy"].as_u64().unwrap_or(0) >= 2, "{v}");
    assert!(v["bars"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert_eq!(v["links"], 4, "{v}");
    // between runs the header keeps the run's total, not 0
    let built = rec["events_built"].as_u64().unwrap();
    let summary = read()["summary"].as_str().unwrap_or("").to_string();
    assert!(
        summary.starts_with(&format!("built {built} events")),
        "after the run: {summary}"
    );
    // Halt asks first: answered no, nothing is sent and the system stays up
    b.eval(
        "window.asked = 0; window.confirm = () => { window.asked += 1; return false; }; return 0;",
    );
    b.click("#btn-halt");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(b.eval("return window.asked;"), 1, "Halt did not ask");
    assert_eq!(up.status()["state"], "ready", "Halt acted without a yes");
    // a large system's matrix (120 RUs × 4 BUs, one link slow) scrolls in its box, and
    // the slow link's cell is paler than the others
    b.eval(
        "const rus = Array.from({length: 120}, (_, i) => 'ru' + i), \
           bus = ['bu0', 'bu1', 'bu2', 'bu3']; \
         const fill = f => rus.map((_, i) => bus.map((_, j) => f(i, j))); \
         const fake = {run: 9, rus, bus, bytes: fill(() => 1e6), queued_bytes: fill(() => 0), \
           bytes_per_s: fill((i, j) => i === 7 && j === 2 ? 1e5 : 1e7)}; \
         const real = window.fetch; \
         window.fetch = (u, o) => String(u).startsWith('/api/v1/links') ? \
           Promise.resolve(new Response(JSON.stringify(fake))) : real(u, o); \
         return 0;",
    );
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let v = b.eval(
            "const box = document.getElementById('links-box'); \
             const cells = document.querySelectorAll('#links td.link'); \
             const light = c => getComputedStyle(c).backgroundColor.match(/\\d+/g) \
               .slice(0, 3).map(Number).reduce((a, x) => a + x, 0); \
             const slow = document.querySelector('#links td[data-ru=\"ru7\"][data-bu=\"bu2\"]'); \
             const fast = document.querySelector('#links td[data-ru=\"ru7\"][data-bu=\"bu1\"]'); \
             return {cells: cells.length, client: box.clientHeight, scroll: box.scrollHeight, \
               slow: slow ? light(slow) : null, fast: fast ? light(fast) : null};",
        );
        if v["cells"] == 480 {
            let (client, scroll) = (v["client"].as_u64().unwrap(), v["scroll"].as_u64().unwrap());
            assert!(
                client <= 600 && scroll > 2 * client,
                "the matrix does not scroll: {v}"
            );
            assert!(
                v["slow"].as_u64().unwrap() > v["fast"].as_u64().unwrap() + 100,
                "the slow link is not paler: {v}"
            );
            eprintln!("page, 120 × 4 matrix: {v}");
            break;
        }
        assert!(
            Instant::now() < until,
            "the 120 × 4 matrix never showed: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // issue 71 item 8: the latency's two lines fit the canvas; in a narrow one the bucket
    // labels thin out rather than run together (`100m250m500m`)
    let v = b.eval(
        "const p = document.getElementById('plot-latency'); \
         const c = document.createElement('canvas'); c.width = 240; c.height = 200; \
         const bounds = [50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, \
           250000, 500000, 1000000, 2500000, 5000000, 10000000]; \
         const lat = {counts: bounds.map(() => 1).concat([1]), bounds_us: bounds, count: 18, \
           bus: 2, p50_us: 1000, p99_us: 5000}; \
         latencyBars(c, lat, {count: 18, p50_us: 1000, p99_us: 5000}); \
         return {fits: p.dataset.titleFits, title: p.dataset.title, \
           narrow: c.dataset.labels.split(' ').length, buckets: Number(c.dataset.buckets)};",
    );
    assert_eq!(v["fits"], "true", "{v}");
    assert!(
        v["title"]
            .as_str()
            .unwrap_or("")
            .contains("from trigger to release"),
        "{v}"
    );
    let narrow = v["narrow"].as_u64().unwrap_or(0);
    assert!((3..18).contains(&narrow) && v["buckets"] == 18, "{v}");
    // a Reset's answer goes once the state moves on: not "reset: stopping" beside "ready"
    assert_eq!(up.post("start", json!({})).0, 200);
    let until = Instant::now() + Duration::from_secs(20);
    while read()["state"] != "running" {
        assert!(Instant::now() < until, "run 2 never showed as running");
        std::thread::sleep(Duration::from_millis(200));
    }
    b.eval("window.confirm = () => true; return 0;");
    b.click("#btn-reset");
    let msg = || b.eval("return document.getElementById('msg').textContent;");
    let until = Instant::now() + Duration::from_secs(20);
    while read()["state"] != "ready" {
        assert!(
            Instant::now() < until,
            "the reset run never showed as ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let said = msg();
    assert!(
        read()["state"] != "ready" || !said.as_str().unwrap_or("").contains("stopping"),
        "{said} beside ready"
    );
    // evb up's own line says what the run records say: aborted, not FAILED
    up.wait_said("run 2 aborted", |lines| {
        lines
            .iter()
            .any(|l| l.contains("run 2 aborted: reset by the operator"))
    });
    assert!(!up.said().iter().any(|l| l.contains("run 2 FAILED")));
    assert_eq!(
        up.api.get("/api/v1/runs/2").unwrap().body["state"],
        "aborted"
    );
    // Halt from the page: what follows is the system's end in words, not a fetch error
    b.click("#btn-halt");
    assert!(up.exited(20).success());
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let said = msg();
        let text = said.as_str().unwrap_or("").to_string();
        if text.starts_with("halted:") {
            assert_eq!(read()["state"], "halted");
            break;
        }
        assert!(
            !text.contains("TypeError") && Instant::now() < until,
            "after Halt the page says: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(b);
}
