//! Keeps the manual honest where that is cheap to check against the real binary:
//! - every `[section] key` documented in `docs/configuration.md` is a key the config file
//!   accepts, and every key it accepts is documented (the binary's own "unknown field, expected
//!   one of …" error is the list of what it accepts);
//! - every `gateway …` command in a shell block of the README or a `docs/` page names real
//!   subcommands and flags (checked with `--help`);
//! - every relative link in those pages points at a file inside the repository (and an
//!   anchor into a page at one of its headings), and no page cites documents kept outside it;
//! - every `sh` block of the README runs as written against the built binary and prints what
//!   the README says it prints.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use regex::Regex;

/// The repository root: the nearest ancestor of this package that holds `docs/`.
fn repo_root() -> PathBuf {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    loop {
        if dir.join("docs/configuration.md").is_file() {
            return dir;
        }
        assert!(
            dir.pop(),
            "no docs/configuration.md above {}",
            env!("CARGO_MANIFEST_DIR")
        );
    }
}

/// README.md and every page under docs/ (not the generated benchmark tables).
fn manual_pages() -> Vec<PathBuf> {
    let root = repo_root();
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs `gateway --config <file with text> config check` and returns its stderr.
fn check_config(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("probe.toml");
    std::fs::write(&path, text).expect("write probe");
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args([
            "--config",
            path.to_str().expect("utf-8 path"),
            "config",
            "check",
        ])
        .output()
        .expect("run gateway");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The keys a table accepts, read from the error the binary gives for an unknown key there.
fn accepted_keys(probe: &str) -> BTreeSet<String> {
    let (ok, err) = check_config(probe);
    assert!(!ok, "probe accepted:\n{probe}");
    let tail = err
        .split_once("unknown field `__probe__`")
        .map(|(_, t)| t)
        .unwrap_or_else(|| panic!("no unknown-field error for probe:\n{probe}\n{err}"));
    let names = Regex::new(r"`([a-z_]+)`").expect("regex");
    names
        .captures_iter(tail)
        .map(|c| c[1].to_string())
        .collect()
}

/// One documented table of `docs/configuration.md`: its heading's TOML path and the keys in
/// its reference table.
#[derive(Debug)]
struct DocTable {
    /// `server`, `server.limits`, `quota.tiers.<tier>`, `providers`, `models.deployments`.
    path: String,
    keys: BTreeSet<String>,
}

/// Headings like ``### `[server.limits]` `` or ``### `[[models]]` `deployments` ``, each followed
/// by a table whose rows start with a backticked key.
fn documented_tables() -> Vec<DocTable> {
    let text = read(&repo_root().join("docs/configuration.md"));
    let heading = Regex::new(r"^#{2,4} `\[\[?([a-z_.<>]+)\]\]?`(?: `([a-z_]+)`)?\s*$").expect("re");
    let row = Regex::new(r"^\| `([a-z_]+)` \|").expect("re");
    let mut tables: Vec<DocTable> = Vec::new();
    for line in text.lines() {
        if let Some(c) = heading.captures(line) {
            let mut path = c[1].to_string();
            if let Some(sub) = c.get(2) {
                path = format!("{path}.{}", sub.as_str());
            }
            tables.push(DocTable {
                path,
                keys: BTreeSet::new(),
            });
        } else if line.starts_with('#') {
            // Another heading ends the table's section.
            tables.push(DocTable {
                path: String::new(),
                keys: BTreeSet::new(),
            });
        } else if let (Some(c), Some(t)) = (row.captures(line), tables.last_mut()) {
            assert!(
                !t.path.is_empty(),
                "configuration.md: key row outside a section: {line}"
            );
            t.keys.insert(c[1].to_string());
        }
    }
    tables.retain(|t| !t.path.is_empty());
    tables
}

/// A TOML text with an unknown key `__probe__` in the table at `path`.
fn probe_for(path: &str) -> String {
    match path {
        "providers" => "[[providers]]\n__probe__ = 1\n".into(),
        "models" => "[[models]]\n__probe__ = 1\n".into(),
        "models.price" => "[[models]]\nid = \"m\"\nprice = { __probe__ = 1 }\n".into(),
        "models.deployments" => {
            "[[models]]\nid = \"m\"\ndeployments = [{ __probe__ = 1 }]\n".into()
        }
        p => format!(
            "[{}]\n__probe__ = 1\n",
            p.replace("<tier>", "beginner")
                .replace("<package>", "steady-100m")
        ),
    }
}

#[test]
fn configuration_reference_matches_the_config_file_model() {
    let tables = documented_tables();
    let mut by_path: BTreeMap<&str, &DocTable> = BTreeMap::new();
    for t in &tables {
        assert!(
            by_path.insert(t.path.as_str(), t).is_none(),
            "configuration.md documents [{}] twice",
            t.path
        );
        assert!(
            !t.keys.is_empty(),
            "configuration.md: [{}] has no keys",
            t.path
        );
    }

    // The top-level sections.
    let documented_top: BTreeSet<String> = tables
        .iter()
        .map(|t| t.path.split('.').next().unwrap_or("").to_string())
        .collect();
    assert_eq!(
        documented_top,
        accepted_keys("__probe__ = 1\n"),
        "top-level sections: documented vs accepted"
    );

    for t in &tables {
        // Child tables documented under their own heading count as keys of their parent.
        let children: BTreeSet<String> = tables
            .iter()
            .filter_map(|c| {
                let rest = c.path.strip_prefix(&t.path)?.strip_prefix('.')?;
                Some(rest.split('.').next().unwrap_or(rest).to_string())
            })
            .collect();
        let documented: BTreeSet<String> = t.keys.union(&children).cloned().collect();
        if t.path == "quota.usage_thresholds" {
            // A map from tier names: each documented name must be one the file accepts.
            for key in &t.keys {
                let (_, err) = check_config(&format!("[quota.usage_thresholds]\n{key} = 1\n"));
                assert!(
                    !err.contains("usage_thresholds"),
                    "[quota.usage_thresholds] {key} is documented but refused: {err}"
                );
            }
            continue;
        }
        let accepted = accepted_keys(&probe_for(&t.path));
        let undocumented: Vec<_> = accepted.difference(&documented).collect();
        let unknown: Vec<_> = documented.difference(&accepted).collect();
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "[{}]: accepted but not in docs/configuration.md: {undocumented:?}; \
             documented but not accepted: {unknown:?}",
            t.path
        );
    }
}

/// The operator commands in shell blocks: `(subcommand words, flags)` per command line.
fn documented_commands() -> Vec<(String, Vec<String>, Vec<String>)> {
    // The binary: `gateway`, `$GW`, or a path to it (`target/release/gateway`,
    // `/usr/local/bin/gateway`), but not a directory that happens to be named so.
    let binary = Regex::new(
        r"(?:^|[\s(])(?:\$GW|gateway|\S*bin/gateway|\S*target/\S+/gateway)\s+([^|;&>)]*)",
    )
    .expect("re");
    let mut out = Vec::new();
    for page in manual_pages() {
        let text = read(&page);
        let name = page
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut in_sh = false;
        let mut joined = String::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            if let Some(info) = trimmed.strip_prefix("```") {
                in_sh = !in_sh && matches!(info.trim(), "sh" | "bash" | "shell");
                continue;
            }
            if !in_sh {
                continue;
            }
            // Comments are prose; a trailing backslash continues the command.
            let code = match line.find(" #") {
                Some(i) => &line[..i],
                None if trimmed.starts_with('#') => "",
                None => line,
            };
            joined.push_str(code.trim_end_matches('\\'));
            joined.push(' ');
            if code.trim_end().ends_with('\\') {
                continue;
            }
            for c in binary.captures_iter(&joined) {
                let mut words = Vec::new();
                let mut flags = Vec::new();
                let mut tokens = c[1].split_whitespace().peekable();
                while let Some(tok) = tokens.next() {
                    let tok = tok.trim_matches(|ch| matches!(ch, '[' | ']' | '\'' | '"'));
                    if tok == "--config" {
                        tokens.next();
                    } else if let Some(flag) = tok.strip_prefix("--") {
                        let flag = flag.split('=').next().unwrap_or(flag);
                        flags.push(flag.to_string());
                    } else if flags.is_empty()
                        && tok.starts_with(|ch: char| ch.is_ascii_lowercase())
                        && tok
                            .chars()
                            .all(|ch| ch.is_ascii_lowercase() || ch == '-' || ch == '2')
                    {
                        words.push(tok.to_string());
                    } else {
                        // A value (or text after the command): later words are not subcommands.
                        flags.push(String::new());
                    }
                }
                flags.retain(|f| !f.is_empty());
                out.push((name.clone(), words, flags));
            }
            joined.clear();
        }
    }
    out
}

#[test]
fn documented_commands_and_flags_exist() {
    let commands = documented_commands();
    // `gateway` is also the service's name and user (`systemctl reload gateway`, `sudo -u
    // gateway sh`): a line is a command of the binary when it starts with one of its
    // subcommands or options.
    let top = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--help")
        .output()
        .expect("run gateway --help");
    let top = String::from_utf8_lossy(&top.stdout).into_owned();
    let subcommands: BTreeSet<&str> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(subcommands.contains("user"), "{top}");
    let mut help_of: BTreeMap<Vec<String>, String> = BTreeMap::new();
    let mut checked = 0;
    for (page, words, flags) in &commands {
        match words.first() {
            Some(w) if !subcommands.contains(w.as_str()) => continue,
            None if flags.is_empty() => continue,
            _ => checked += 1,
        }
        let help = help_of.entry(words.clone()).or_insert_with(|| {
            let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
                .args(words)
                .arg("--help")
                .output()
                .expect("run gateway --help");
            assert!(
                out.status.success(),
                "{page}: `gateway {}` is not a command: {}",
                words.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        });
        for flag in flags {
            assert!(
                help.contains(&format!("--{flag}")),
                "{page}: `gateway {}` has no flag --{flag}:\n{help}",
                words.join(" ")
            );
        }
    }
    assert!(
        checked >= 20,
        "expected the manual to show the operator commands, found {checked}"
    );
}

/// GitHub's anchor of a heading: lowercase, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors_of(page: &Path) -> BTreeSet<String> {
    read(page)
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| anchor(h.trim_start_matches('#')))
        .collect()
}

#[test]
fn links_stay_inside_the_repository_and_resolve() {
    let root = repo_root().canonicalize().expect("root");
    let link = Regex::new(r"\]\(([^)\s]+)\)").expect("re");
    for page in manual_pages() {
        let text = read(&page);
        // `§` numbers sections of the specification, which is not in the repository.
        for outside in ["CONTRACT", "gateway-spec", "../shared", "spec §", "§"] {
            assert!(
                !text.contains(outside),
                "{}: cites a document outside the repository ({outside})",
                page.display()
            );
        }
        let dir = page.parent().expect("page dir");
        for c in link.captures_iter(&text) {
            let target = &c[1];
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target, None),
            };
            let resolved = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            let resolved = resolved
                .canonicalize()
                .unwrap_or_else(|_| panic!("{}: link to a missing file: {target}", page.display()));
            assert!(
                resolved.starts_with(&root),
                "{}: link leaves the repository: {target}",
                page.display()
            );
            if let Some(fragment) = fragment {
                if resolved.extension().is_some_and(|x| x == "md") {
                    assert!(
                        anchors_of(&resolved).contains(fragment),
                        "{}: no heading #{fragment} in {}",
                        page.display(),
                        resolved.display()
                    );
                }
            }
        }
    }
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Environment variables the gateway's code reads by name.
fn variables_read_by_the_code() -> BTreeSet<String> {
    let root = repo_root();
    let mut files = Vec::new();
    for dir in ["src", "crates"] {
        rust_files(&root.join(dir), &mut files);
    }
    // The benchmark programs are not the product: their knobs are documented beside them.
    let bench = root.join("crates/bench");
    files.retain(|f| !f.starts_with(&bench));
    let reads = Regex::new(r#"env::var(?:_os)?\(\s*"([A-Z][A-Z0-9_]*)"\s*\)"#).expect("re");
    let constant = Regex::new(r#"const [A-Z0-9_]+_ENV: &str = "([A-Z][A-Z0-9_]*)""#).expect("re");
    let mut names = BTreeSet::new();
    for file in files {
        let text = read(&file);
        for c in reads
            .captures_iter(&text)
            .chain(constant.captures_iter(&text))
        {
            names.insert(c[1].to_string());
        }
    }
    names
}

#[test]
fn every_environment_variable_is_documented_and_in_the_template() {
    let root = repo_root();
    let names = variables_read_by_the_code();
    for expected in ["GATEWAY_KEY_PEPPER", "SMTP_PASSWORD", "GATEWAY_UPGRADE"] {
        assert!(
            names.contains(expected),
            "the scan of the code missed {expected}: {names:?}"
        );
    }
    let operations = read(&root.join("docs/operations.md"));
    let template = read(&root.join("conf/gateway.env.example"));
    let in_template = |name: &str| {
        template
            .lines()
            .any(|l| l.trim_start_matches('#').starts_with(&format!("{name}=")))
    };
    // Read by a command for its own purpose, or set only for one start: not deployment settings.
    let not_settings = ["USER", "LOGNAME", "GATEWAY_UPGRADE"];
    for name in &names {
        // The test suite's own switches (GATEWAY_TEST_*) are not the gateway's settings.
        if ["USER", "LOGNAME"].contains(&name.as_str()) || name.starts_with("GATEWAY_TEST_") {
            continue;
        }
        assert!(
            operations.contains(&format!("`{name}`")),
            "docs/operations.md does not document {name}"
        );
        if !not_settings.contains(&name.as_str()) {
            assert!(
                in_template(name),
                "conf/gateway.env.example does not list {name}"
            );
        }
    }
    // The provider keys the shipped config names.
    let shipped = read(&root.join("conf/gateway.toml"));
    let key_env = Regex::new(r#"(?m)^api_key_env\s*=\s*"([A-Z0-9_]+)""#).expect("re");
    for c in key_env.captures_iter(&shipped) {
        assert!(
            in_template(&c[1]),
            "conf/gateway.env.example does not list {}",
            &c[1]
        );
    }
    assert!(in_template("RUST_LOG"));
}

// ---------------------------------------------------------------------------------------------
// The README's commands, run.

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// The fenced blocks of `text` whose info string is `lang`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            match current.take() {
                Some(block) => out.push(block),
                None if info.trim() == lang => current = Some(String::new()),
                None => current = Some(String::from("\u{0}")),
            }
            continue;
        }
        if let Some(block) = current.as_mut() {
            block.push_str(line);
            block.push('\n');
        }
    }
    out.retain(|b| !b.starts_with('\u{0}'));
    out
}

/// Variables a block assigns at the start of a line (`GW=…`, `KEY=$(…)`), which later blocks
/// use as one terminal session would.
fn assigned(block: &str) -> Vec<String> {
    let re = Regex::new(r"(?m)^\s*([A-Z][A-Z0-9_]*)=").expect("re");
    let mut names: Vec<String> = re.captures_iter(block).map(|c| c[1].to_string()).collect();
    names.dedup();
    names
}

/// Kills what a block left running in the background (the README starts the mock provider with
/// `&`) when the test ends, however it ends.
struct ProcessGroups(Vec<u32>);

impl Drop for ProcessGroups {
    fn drop(&mut self) {
        for pgid in &self.0 {
            // The group of one block (never 0 or 1, which would reach this test's own group
            // or every process): signalled directly, since `kill(1)`'s parsing of a negative
            // pid after a signal name differs between implementations.
            if let Ok(pgid) = i32::try_from(*pgid) {
                if pgid > 1 {
                    // SAFETY: kill(2) only sends a signal.
                    unsafe {
                        libc::kill(-pgid, libc::SIGTERM);
                    }
                }
            }
        }
    }
}

/// The gateway the README's commands talk to, stopped when the test ends however it ends.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One README block after its run: exit status and output.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// A working directory laid out like the repository for the README's commands: the shipped
/// `conf/gateway.toml` (listen addresses and the mock's port replaced by free ports),
/// `conf/tos.md`, and `target/release/gateway` standing for the built binary.
struct Checkout {
    dir: tempfile::TempDir,
    api: String,
    site: String,
    mock: String,
    vars: Vec<(String, String)>,
    groups: ProcessGroups,
}

impl Checkout {
    fn new() -> Checkout {
        let root = repo_root();
        let dir = tempfile::tempdir().expect("tempdir");
        let (api, site, mock) = (
            format!("127.0.0.1:{}", free_port()),
            format!("127.0.0.1:{}", free_port()),
            format!("127.0.0.1:{}", free_port()),
        );
        let shipped = read(&root.join("conf/gateway.toml"));
        for needed in ["127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:9000"] {
            assert!(
                shipped.contains(needed),
                "conf/gateway.toml has no {needed}"
            );
        }
        let config = Checkout::addresses(&shipped, &api, &site, &mock);
        std::fs::create_dir_all(dir.path().join("conf")).expect("conf/");
        std::fs::write(dir.path().join("conf/gateway.toml"), config).expect("config");
        std::fs::copy(root.join("conf/tos.md"), dir.path().join("conf/tos.md")).expect("tos");
        std::fs::create_dir_all(dir.path().join("target/release")).expect("target/release");
        std::os::unix::fs::symlink(
            env!("CARGO_BIN_EXE_gateway"),
            dir.path().join("target/release/gateway"),
        )
        .expect("gateway link");
        // No request of the README may hang the test.
        std::fs::write(dir.path().join(".curlrc"), "max-time = 60\n").expect("curlrc");
        Checkout {
            dir,
            api,
            site,
            mock,
            vars: Vec::new(),
            groups: ProcessGroups(Vec::new()),
        }
    }

    /// `text` with the documented addresses replaced by this checkout's.
    fn addresses(text: &str, api: &str, site: &str, mock: &str) -> String {
        text.replace("127.0.0.1:8080", api)
            .replace("127.0.0.1:8081", site)
            .replace("127.0.0.1:9000", mock)
    }

    /// Starts the gateway as `scripts/run` does (`conf/gateway.toml` from the working
    /// directory), waiting for its listening line.
    fn start_gateway(&mut self) -> Running {
        let mut child = Command::new("target/release/gateway")
            .current_dir(self.dir.path())
            .env("RUST_LOG", "warn")
            .env_remove("GATEWAY_KEY_PEPPER")
            .env_remove("GATEWAY_SESSION_SECRET")
            .env_remove("GATEWAY_WEBHOOK_SECRET")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::from(
                std::fs::File::create(self.dir.path().join("gateway.log")).expect("log"),
            ))
            .spawn()
            .expect("start the gateway");
        let line = common::wait_line(&mut child, "gateway listening", Duration::from_secs(60));
        assert!(
            line.contains(&format!("api={}", self.api)),
            "{line} (the README's gateway prints its addresses)"
        );
        Running(child)
    }

    /// Runs `block` with bash in the checkout (`set -eo pipefail`, after the variables earlier
    /// blocks set), with the README's addresses and the placeholders in `fill` replaced; the
    /// mock provider's `cargo run` stands for the built mock. Returns the block's outcome and
    /// keeps the variables it assigned.
    fn run(&mut self, block: &str, fill: &[(&str, &str)]) -> Ran {
        let mut script = Checkout::addresses(block, &self.api, &self.site, &self.mock).replace(
            "cargo run --release --bin mock-provider --",
            &format!("'{}'", env!("CARGO_BIN_EXE_mock-provider")),
        );
        for (placeholder, value) in fill {
            script = script.replace(placeholder, value);
        }
        let left: Vec<&str> = script
            .lines()
            .filter(|l| l.split(" #").next().is_some_and(|code| code.contains('…')))
            .collect();
        assert!(
            left.is_empty(),
            "README commands with a placeholder this test cannot fill: {left:?}"
        );
        let mut prelude = String::from("set -eo pipefail\n");
        for (name, value) in &self.vars {
            prelude.push_str(&format!("{name}='{value}'\n"));
        }
        let names = assigned(block);
        let mut epilogue = String::from("\n");
        for name in &names {
            epilogue.push_str(&format!("printf '@@%s=%s\\n' {name} \"${name}\"\n"));
        }
        let out_path = self.dir.path().join("block.out");
        let err_path = self.dir.path().join("block.err");
        let mut child = Command::new("timeout")
            .args(["180", "bash", "-c", &format!("{prelude}{script}{epilogue}")])
            .current_dir(self.dir.path())
            .env("CURL_HOME", self.dir.path())
            .env_remove("GATEWAY_KEY_PEPPER")
            .stdin(std::process::Stdio::null())
            // Files, not pipes: a process the block leaves running must not hold them open.
            .stdout(std::fs::File::create(&out_path).expect("out"))
            .stderr(std::fs::File::create(&err_path).expect("err"))
            .process_group(0)
            .spawn()
            .expect("run bash");
        self.groups.0.push(child.id());
        let status = child.wait().expect("bash");
        let stdout = read(&out_path);
        let stderr = read(&err_path);
        let mut kept = String::new();
        for line in stdout.lines() {
            match line.strip_prefix("@@").and_then(|l| l.split_once('=')) {
                Some((name, value)) if names.iter().any(|n| n == name) => {
                    self.vars.retain(|(n, _)| n != name);
                    self.vars.push((name.to_string(), value.to_string()));
                }
                _ => {
                    kept.push_str(line);
                    kept.push('\n');
                }
            }
        }
        Ran {
            ok: status.success(),
            stdout: kept,
            stderr,
        }
    }

    fn var(&self, name: &str) -> String {
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} set by the README's blocks"))
    }

    /// An admin command in the checkout; its JSON output.
    fn admin(&self, args: &[&str]) -> serde_json::Value {
        let out = Command::new("target/release/gateway")
            .current_dir(self.dir.path())
            .args(args)
            .env_remove("GATEWAY_KEY_PEPPER")
            .output()
            .expect("admin command");
        assert!(out.status.success(), "{args:?}: {out:?}");
        serde_json::from_slice(&out.stdout).expect("admin JSON")
    }
}

/// The Python a README block runs with: `GATEWAY_TEST_PYTHON`, else the repository's `.venv`
/// (`scripts/setup` installs the SDKs there), when it imports both SDKs.
fn sdk_python() -> Option<PathBuf> {
    let python = std::env::var_os("GATEWAY_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/python"));
    let ok = Command::new(&python)
        .args(["-c", "import openai, anthropic"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// Every `sh` block of the README runs, in order, against the built binary as a newcomer would
/// run it from a checkout: the shipped config on free ports (the documented addresses replaced
/// by them), the gateway started as `scripts/run` starts it, the mock provider started by the
/// first-request block itself; each block must exit 0 and print what the README says it
/// prints. `scripts/run` and `scripts/test` are only checked to exist and be executable (the
/// one builds a release binary, the other is this suite). The Python block runs too when the
/// SDKs are installed.
#[test]
fn the_readme_commands_run() {
    let root = repo_root();
    let readme = read(&root.join("README.md"));
    let sh = blocks(&readme, "sh");
    assert!(sh.len() >= 4, "README sh blocks: {}", sh.len());
    assert!(readme.contains("gateway listening api=127.0.0.1:8080 site=127.0.0.1:8081"));
    let mut co = Checkout::new();
    let gateway = co.start_gateway();
    let scripts: Vec<(String, String)> = ["run", "test", "setup"]
        .iter()
        .map(|s| {
            (
                format!("scripts/{s} "),
                format!("test -x '{}/scripts/{s}' ", root.display()),
            )
        })
        .collect();
    let mut ran = 0;
    let mut checked = Vec::new();
    for block in &sh {
        let mut fill: Vec<(&str, &str)> = scripts
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let key_id;
        if block.contains("key_…") {
            let keys = co.admin(&["key", "list", "--email", "you@example.com"]);
            key_id = keys["keys"][0]["id"].as_str().expect("a key").to_string();
            fill.push(("key_…", &key_id));
        }
        if block.contains("data/outbox") {
            // The panel's sign-in, as the README describes it just above the block.
            let site = co.site.clone();
            let r = Command::new("curl")
                .args(["-s", "-X", "POST"])
                .arg(format!("http://{site}/api/auth/request-code"))
                .args(["-H", &format!("Origin: http://{site}")])
                .args(["-H", "content-type: application/json"])
                .args(["-d", r#"{"email":"you@example.com","acceptedTerms":true}"#])
                .output()
                .expect("curl");
            assert!(
                String::from_utf8_lossy(&r.stdout).contains("\"ok\":true"),
                "{r:?}"
            );
        }
        let out = co.run(block, &fill);
        assert!(
            out.ok,
            "README block failed:\n{block}\nstdout:\n{}\nstderr:\n{}\ngateway log:\n{}",
            out.stdout,
            out.stderr,
            read(&co.dir.path().join("gateway.log"))
        );
        ran += 1;
        // What the README says each block prints.
        if block.contains("/v1/chat/completions") {
            assert!(
                out.stdout.contains(r#""choices":[{"#)
                    && out
                        .stdout
                        .contains(r#""content":"Hello from the mock provider.""#),
                "the first answer: {}",
                out.stdout
            );
            for event in ["message_start", "content_block_delta", "message_stop"] {
                assert!(
                    out.stdout.contains(&format!("event: {event}")),
                    "the stream: {}",
                    out.stdout
                );
            }
            assert!(co.var("KEY").starts_with("sk-"), "KEY is the secret");
            checked.push("first request");
            if let Some(python) = sdk_python() {
                let code = blocks(&readme, "python")
                    .into_iter()
                    .find(|b| b.contains("from openai import OpenAI"))
                    .expect("the SDK example");
                let code = Checkout::addresses(&code, &co.api, &co.site, &co.mock);
                std::fs::write(co.dir.path().join("first.py"), code).expect("first.py");
                let r = Command::new(python)
                    .arg("first.py")
                    .current_dir(co.dir.path())
                    .env("KEY", co.var("KEY"))
                    .output()
                    .expect("python");
                let printed = String::from_utf8_lossy(&r.stdout);
                assert!(
                    r.status.success()
                        && printed.lines().count() == 3
                        && printed.lines().all(|l| l.contains("mock provider")),
                    "first.py: {r:?}"
                );
                checked.push("first.py");
            } else {
                eprintln!("README's first.py not run: no Python with the openai and anthropic SDKs (scripts/setup)");
            }
        }
        if block.contains("data/outbox") {
            assert!(
                out.stdout.len() == 7
                    && out.stdout.ends_with('\n')
                    && out.stdout[..6].bytes().all(|b| b.is_ascii_digit()),
                "the code: {:?}",
                out.stdout
            );
            checked.push("outbox code");
        }
        if block.contains("$GW user list") {
            for shape in [
                r#""users":["#,
                r#""email":"you@example.com""#,
                r#""status":"revoked""#,
                r#""type":"token""#,
                "model,requests,",
                r#""ok":true"#,
            ] {
                assert!(out.stdout.contains(shape), "{shape}: {}", out.stdout);
            }
            checked.push("operator commands");
        }
    }
    assert_eq!(ran, sh.len());
    for expected in ["first request", "outbox code", "operator commands"] {
        assert!(
            checked.contains(&expected),
            "{expected} not checked: {checked:?}"
        );
    }
    // `kill -HUP` reloaded the config; the gateway still serves.
    let health = Command::new("curl")
        .args(["-s", &format!("http://{}/health", co.api)])
        .output()
        .expect("curl");
    assert_eq!(String::from_utf8_lossy(&health.stdout), r#"{"ok":true}"#);
    drop(gateway);
}
