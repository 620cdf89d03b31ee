//! Embeds the git commit the binary is built from, for `gateway --version`: `git rev-parse
//! --short HEAD` when the source is a git checkout with git installed, else `unknown`.
//! `GATEWAY_BUILD_COMMIT` overrides it (builds from a source archive).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=GATEWAY_BUILD_COMMIT");
    let commit = std::env::var("GATEWAY_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=GATEWAY_GIT_COMMIT={commit}");
    // Build again when HEAD moves: the checkout's HEAD file (a branch switch) and the branch's
    // ref (a commit), wherever git keeps them (worktrees keep HEAD apart from the refs).
    let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&["rev-parse", "--git-path", &branch]));
    }
    watched.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    for path in watched.into_iter().flatten() {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    // `sqlx::migrate!` embeds the migration folders, but only files that existed at the last
    // build are watched: a new migration must rebuild the crate too.
    println!("cargo:rerun-if-changed=migrations");
    println!("cargo:rerun-if-changed=build.rs");
}
