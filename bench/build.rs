//! Embeds the commit the benchmark is built from: the GPU machine has no git checkout.

use std::process::Command;

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for f in [".git/HEAD", ".git/index"] {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let commit = Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .current_dir(&root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FERROFUSE_BENCH_COMMIT={commit}");
}
