use super::*;
use proptest::prelude::*;

fn errors_of(text: &str) -> Vec<String> {
    match load_str(text, "test.yaml") {
        Ok(config) => panic!("expected errors, got {config:?}"),
        Err(error) => error.errors.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn embedded_defaults_are_valid() {
    let config = Config::embedded_defaults().expect("embedded defaults must validate");
    assert_eq!(
        config.listeners.admin.address,
        "127.0.0.1:9901".parse().unwrap()
    );
    assert_eq!(config.runtime.drain_timeout, Duration::from_secs(5));
    assert_eq!(config.runtime.driver, DriverChoice::Auto);
}

#[test]
fn empty_document_means_defaults() {
    for text in ["", "# only a comment\n", "---\n"] {
        let config = load_str(text, "empty.yaml").expect("empty config is valid");
        assert_eq!(config.runtime.workers, Workers::Auto);
        assert_eq!(config.runtime.uring_entries, 1024);
        assert_eq!(config.runtime.drain_timeout, Duration::from_secs(30));
        assert_eq!(config.logging.format, LogFormat::Text);
        assert_eq!(config.listeners.admin.backlog, 1024);
    }
}

#[test]
fn full_document_is_read() {
    let config = load_str(
        "runtime: {workers: 3, driver: legacy, uring_entries: 512, drain_timeout: 2m}\n\
         logging: {format: json, level: 'warn,sluice_runtime=debug'}\n\
         listeners:\n  admin: {address: '[::1]:0', backlog: 16, max_connections_per_worker: 8, \
         header_timeout: 1s, idle_timeout: 250ms}\n",
        "full.yaml",
    )
    .expect("valid");
    assert_eq!(
        config.runtime.workers,
        Workers::Count(NonZeroUsize::new(3).unwrap())
    );
    assert_eq!(config.runtime.workers.resolve(), 3);
    assert_eq!(config.runtime.driver, DriverChoice::Legacy);
    assert_eq!(config.runtime.uring_entries, 512);
    assert_eq!(config.runtime.drain_timeout, Duration::from_secs(120));
    assert_eq!(config.logging.format, LogFormat::Json);
    assert_eq!(config.logging.level, "warn,sluice_runtime=debug");
    let admin = &config.listeners.admin;
    assert_eq!(admin.address, "[::1]:0".parse().unwrap());
    assert_eq!(admin.backlog, 16);
    assert_eq!(admin.max_connections_per_worker, 8);
    assert_eq!(admin.header_timeout, Duration::from_secs(1));
    assert_eq!(admin.idle_timeout, Duration::from_millis(250));
}

#[test]
fn every_mistake_is_reported_with_its_path() {
    let errors = errors_of(
        "runtime:\n  workers: 0\n  drain_timeout: soon\n  colour: blue\nlisteners:\n  admin:\n    address: \"x:y\"\n",
    );
    assert_eq!(
        errors,
        vec![
            "runtime.colour: unknown field".to_string(),
            "runtime.workers: must be at least 1 (or \"auto\" for one per CPU)".to_string(),
            "runtime.drain_timeout: invalid duration \"soon\": expected a number with a unit such as 500ms, 30s or 5m".to_string(),
            "listeners.admin.address: invalid socket address \"x:y\": expected IP:PORT such as 127.0.0.1:9901 or [::1]:9901".to_string(),
        ]
    );
}

#[test]
fn error_display_names_the_origin_on_every_line() {
    let error = load_str("logging: {format: xml}\nbogus: 1\n", "/etc/sluice.yaml").unwrap_err();
    let text = error.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines
            .iter()
            .all(|line| line.starts_with("/etc/sluice.yaml: ")),
        "{text}"
    );
    assert!(text.contains("bogus: unknown field"), "{text}");
    assert!(
        text.contains("logging.format: invalid value \"xml\": expected one of text, json"),
        "{text}"
    );
}

#[test]
fn wrong_shapes_and_ranges_are_errors() {
    let errors = errors_of(
        "runtime: {driver: [uring], uring_entries: 300, workers: 5000}\nlisteners: {admin: {backlog: -1}}\nlogging: {level: 'info,=['}\n",
    );
    assert!(
        errors.contains(&"runtime.driver: expected a single value, found a list".to_string()),
        "{errors:?}"
    );
    assert!(
        errors.contains(&"runtime.uring_entries: 300 is not a power of two".to_string()),
        "{errors:?}"
    );
    assert!(
        errors.contains(&"runtime.workers: 5000 is more than the limit of 1024".to_string()),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("listeners.admin.backlog: invalid number \"-1\"")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("logging.level: invalid log filter")),
        "{errors:?}"
    );
}

#[test]
fn structural_mistake_reports_path() {
    let errors = errors_of("listeners: 5\n");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        errors[0],
        "listeners: invalid type: integer `5`, expected a mapping at line 1 column 12"
    );
}

#[test]
fn syntax_error_reports_position() {
    let errors = errors_of("runtime:\n  workers: [1\n");
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("line"), "{errors:?}");
}

#[test]
fn missing_file_is_a_clear_error() {
    let error = load_file(Path::new("/nonexistent/sluice.yaml")).unwrap_err();
    assert_eq!(error.origin, "/nonexistent/sluice.yaml");
    assert!(error.to_string().contains("cannot read file"), "{error}");
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in ".{0,400}") {
        let _ = load_str(&text, "fuzz.yaml");
    }

    #[test]
    fn arbitrary_yaml_shapes_never_panic(
        section in prop::sample::select(vec!["runtime", "logging", "listeners", "other"]),
        key in prop::sample::select(vec!["workers", "driver", "uring_entries", "drain_timeout", "format", "level", "admin", "address", "x"]),
        value in prop_oneof![
            Just("~".to_string()),
            Just("[]".to_string()),
            Just("{}".to_string()),
            "-?[0-9]{1,25}",
            "[a-z:.\\[\\]0-9]{0,30}",
            Just("{address: 1, backlog: '99999999999999999999999'}".to_string()),
        ],
    ) {
        let text = format!("{section}:\n  {key}: {value}\n");
        let _ = load_str(&text, "fuzz.yaml");
    }
}
