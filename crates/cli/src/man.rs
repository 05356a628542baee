//! `evb man`: manual pages from the command line's own definition (clap_mangen), with the
//! sections a man page reader looks for that clap does not know: ENVIRONMENT (on every page)
//! and EXAMPLES (on the pages of the commands people start with).

use std::io::Write;
use std::path::Path;

/// The environment variables evb reads, for every page.
const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "EVB_SECRET",
        "The run's shared secret, in place of run.secret: nodes, consumers and subscribers \
         authenticate each other with it, and evb ctl derives its control token from it.",
    ),
    (
        "EVB_URL",
        "The control API evb ctl talks to when --url is not given (evb up prints it).",
    ),
    (
        "EVB_LOG",
        "What is logged to standard error, as a tracing filter: error, warn (the default), \
         info, debug, or per module (evb_node=debug).",
    ),
    (
        "EVB_LIBFABRIC",
        "The libfabric shared library the ofi transport loads (default libfabric.so.1).",
    ),
];

/// Examples by page name (the command's full name, dashes between words).
const EXAMPLES: &[(&str, &[(&str, &str)])] = &[
    (
        "evb",
        &[
            (
                "evb run",
                "A complete local event builder on the built-in configuration.",
            ),
            (
                "evb config default > run.toml",
                "The built-in configuration, to edit.",
            ),
            (
                "evb up --config run.toml",
                "A long-lived system; then evb ctl start, evb ctl status.",
            ),
            (
                "evb inspect --run out",
                "Is a run's output complete? (from its run manifest)",
            ),
        ],
    ),
    (
        "evb-run",
        &[
            (
                "evb run",
                "1 EVM, 2 RUs, 2 BUs on 127.0.0.1 for 10 s; a verdict at the end.",
            ),
            (
                "evb run --config cms.toml --json summary.json",
                "A run of one's own configuration, its summary also as JSON.",
            ),
            (
                "evb run --rus 4 --bus 3 --events 10000",
                "Another shape, a fixed number of events.",
            ),
        ],
    ),
    (
        "evb-inspect",
        &[
            (
                "evb inspect out/",
                "Every event file in out/: events, sources, checksums.",
            ),
            (
                "evb inspect out/run1_bu0_000000.evb --event 8",
                "One event, fragment by fragment.",
            ),
            (
                "evb inspect --run out --clean",
                "Judge a run's output from its manifest; remove its temporary files.",
            ),
        ],
    ),
    (
        "evb-up",
        &[(
            "evb up --config run.toml",
            "Start the nodes and wait for commands: evb ctl start, evb ctl stop, evb ctl halt.",
        )],
    ),
    (
        "evb-ctl",
        &[
            (
                "evb ctl status",
                "The run's state and counts (EVB_URL or --url names the system).",
            ),
            (
                "evb ctl start",
                "Start a run of the configuration evb up was given.",
            ),
            (
                "evb ctl runs",
                "Every run of this system, with its verdict.",
            ),
        ],
    ),
    (
        "evb-bench",
        &[
            ("evb bench --quick", "Every benchmark in a few seconds."),
            (
                "evb bench pipeline --reps 5",
                "The recorded CMS data through the real pipeline, against raw transfer.",
            ),
        ],
    ),
];

/// `s` as roff text: backslashes doubled, a leading dot or quote kept from being a request.
fn roff(s: &str) -> String {
    let s = s.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
}

/// ENVIRONMENT and, where the page has some, EXAMPLES.
fn sections(page: &str) -> String {
    let mut t = String::from(".SH ENVIRONMENT\n");
    for (name, what) in ENVIRONMENT {
        t += &format!(".TP\n\\fB{}\\fR\n{}\n", roff(name), roff(what));
    }
    if let Some((_, examples)) = EXAMPLES.iter().find(|(p, _)| *p == page) {
        t += ".SH EXAMPLES\n";
        for (cmd, what) in *examples {
            t += &format!(".TP\n\\fB{}\\fR\n{}\n", roff(cmd), roff(what));
        }
    }
    t
}

/// One page: clap_mangen's sections, then ours, then the version.
pub fn render(cmd: &clap::Command, w: &mut dyn Write) -> std::io::Result<()> {
    let page = cmd.get_display_name().unwrap_or(cmd.get_name()).to_string();
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(w)?;
    }
    w.write_all(sections(&page).as_bytes())?;
    if cmd.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// The page of `cmd` and of every subcommand into `dir` (evb.1, evb-ctl-start.1 ...).
pub fn generate_to(cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
    fn each(cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            each(sub, dir)?;
        }
        let name = clap_mangen::Man::new(cmd.clone()).get_filename();
        let mut f = std::fs::File::create(dir.join(name))?;
        render(&cmd, &mut f)?;
        f.flush()
    }
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    each(cmd, dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn every_page_has_the_environment_and_the_main_ones_examples() {
        let dir = tempfile::tempdir().unwrap();
        generate_to(crate::Cli::command(), dir.path()).unwrap();
        let page = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap();
        for name in ["evb.1", "evb-run.1", "evb-ctl-start.1", "evb-inspect.1"] {
            let p = page(name);
            assert!(
                p.contains(".SH ENVIRONMENT") && p.contains("EVB_SECRET"),
                "{name}"
            );
            assert!(p.contains(".SH OPTIONS"), "{name}");
        }
        for name in [
            "evb.1",
            "evb-run.1",
            "evb-inspect.1",
            "evb-up.1",
            "evb-ctl.1",
        ] {
            assert!(page(name).contains(".SH EXAMPLES"), "{name}");
        }
        assert!(page("evb-inspect.1").contains("evb inspect \\-\\-run out \\-\\-clean"));
        // every example names a page that exists
        for (p, _) in EXAMPLES {
            assert!(dir.path().join(format!("{p}.1")).exists(), "{p}");
        }
    }
}
