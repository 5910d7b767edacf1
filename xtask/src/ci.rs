//! `cargo xtask ci`: everything CI checks, in the order that fails fastest.

use std::process::Command;

use crate::tools;

pub fn run() -> Result<(), String> {
    let cargo = tools::cargo();
    let root = tools::repo_root();
    let step = |title: &str, args: &[&str]| -> Result<(), String> {
        eprintln!("\n== {title}: cargo {}", args.join(" "));
        tools::run(Command::new(&cargo).args(args).current_dir(&root))
    };
    step("format", &["fmt", "--all", "--", "--check"])?;
    step(
        "lint",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    step("tests", &["test", "--workspace"])?;
    eprintln!("\n== ptx: build every arch, check with ptxas");
    crate::ptx::run(&crate::ptx::Args::default())
}
