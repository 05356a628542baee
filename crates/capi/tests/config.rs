//! A configuration by path or as TOML text, called as C would call the entry points: what
//! cannot be read, parsed or validated is `EVB_ERR_CONFIG` with a message saying where,
//! a NULL is `EVB_ERR_ARG`, and nothing is started (no handle written). A run started from
//! TOML text is tested with the C programs (crates/cli/tests/plugin_c.rs).

use std::ffi::{c_char, c_int, CStr, CString};
use std::ptr::null_mut;

use evb::*;

fn last() -> String {
    // SAFETY: evb_last_error returns a NUL-terminated string valid until the next call.
    unsafe { CStr::from_ptr(evb_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

/// Every start function given `config` (TOML text to the `*_toml` ones, a path to the
/// others): its code, and whether it wrote a handle.
fn starts(config: *const c_char, toml: bool) -> Vec<(c_int, bool)> {
    let id = c("ru0");
    let mut p: *mut EvbProducer = null_mut();
    let mut many: [*mut EvbProducer; 4] = [null_mut(); 4];
    let mut count = 0usize;
    let mut cons: *mut EvbConsumer = null_mut();
    // SAFETY: the strings are NUL-terminated (or NULL, which is answered), the out-pointers
    // valid for their writes (`many` for 4).
    let codes = unsafe {
        if toml {
            [
                evb_producer_start_toml(config, id.as_ptr(), &mut p),
                evb_producer_start_many_toml(config, id.as_ptr(), many.as_mut_ptr(), 4, &mut count),
                evb_consumer_start_toml(config, id.as_ptr(), 0, &mut cons),
            ]
        } else {
            [
                evb_producer_start(config, id.as_ptr(), &mut p),
                evb_producer_start_many(config, id.as_ptr(), many.as_mut_ptr(), 4, &mut count),
                evb_consumer_start(config, id.as_ptr(), 0, &mut cons),
            ]
        }
    };
    let wrote = [
        !p.is_null(),
        many.iter().any(|h| !h.is_null()),
        !cons.is_null(),
    ];
    codes.into_iter().zip(wrote).collect()
}

#[test]
fn bad_configuration_text_is_evb_err_config_naming_the_fault() {
    let refused = vec![(EVB_ERR_CONFIG, false); 3];
    let text = c("[run\nid = 1\n");
    assert_eq!(starts(text.as_ptr(), true), refused);
    assert!(last().starts_with("configuration text: "), "{}", last());
    // parses, but is not a valid configuration
    let text = c("[fragments]\nsize = 0\n");
    assert_eq!(starts(text.as_ptr(), true), refused);
    assert!(last().contains("fragments.size"), "{}", last());
    // a key that is not evb's
    let text = c("[run]\nevents = 10\nnot_a_key = 1\n");
    assert_eq!(starts(text.as_ptr(), true), refused);
    assert!(last().contains("not_a_key"), "{}", last());
    // NULL
    assert_eq!(
        starts(std::ptr::null(), true),
        vec![(EVB_ERR_ARG, false); 3]
    );
    assert!(last().contains("toml is NULL"), "{}", last());
}

#[test]
fn a_path_that_cannot_be_read_or_parsed_is_evb_err_config_too() {
    let refused = vec![(EVB_ERR_CONFIG, false); 3];
    let path = c("/nonexistent/evb/run.toml");
    assert_eq!(starts(path.as_ptr(), false), refused);
    assert!(last().contains("/nonexistent/evb/run.toml"), "{}", last());
    let dir = std::env::temp_dir().join(format!("evb-capi-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    std::fs::write(&file, "[fragments]\nsize = 0\n").unwrap();
    let path = c(file.to_str().unwrap());
    assert_eq!(starts(path.as_ptr(), false), refused);
    assert!(last().contains("fragments.size"), "{}", last());
    let _ = std::fs::remove_dir_all(&dir);
}
