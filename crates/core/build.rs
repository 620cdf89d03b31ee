//! `sqlx::migrate!` embeds the migration folders, but cargo only watches files that existed at
//! the last build: a new migration must rebuild the crate too.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
    println!("cargo:rerun-if-changed=build.rs");
}
