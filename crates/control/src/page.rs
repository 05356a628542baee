//! The run page served by the EVM at `/`: plain HTML and JavaScript inside the binary (no
//! CDN, no build step), polling `GET /api/v1/status` once a second and
//! plotting the controller's rate history (`GET /api/v1/history`).

pub const PAGE: &str = include_str!("page.html");
