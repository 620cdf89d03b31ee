//! The official Python SDKs (`tests/sdk/*.py`) run against a test gateway.

/// The Python that has the SDKs installed (`GATEWAY_TEST_PYTHON`), or `None` after saying that
/// the SDK test is skipped.
pub fn python() -> Option<String> {
    let python = std::env::var("GATEWAY_TEST_PYTHON").ok();
    if python.is_none() {
        eprintln!("GATEWAY_TEST_PYTHON not set (scripts/test sets it); skipping the SDK test");
    }
    python
}

/// Runs `tests/sdk/<script>` with `args` under `python`; panics with its output unless it exits
/// cleanly. Returns what it printed.
pub fn run_script(python: &str, script: &str, args: &[&str]) -> String {
    let path = format!("{}/tests/sdk/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(python)
        .arg(path)
        .args(args)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}
