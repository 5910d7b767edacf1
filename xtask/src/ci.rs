//! `cargo xtask ci`: everything CI checks, in the order that fails fastest.
//!
//! After the nightly checks of this repository, the user's side: the crates a user compiles
//! must build on stable Rust at the declared MSRV, with no nightly toolchain involved. So a
//! downstream crate (`tests/downstream/`) and the packaged `ferrofuse-common` and `ferrofuse`
//! crates are copied out of the repository (away from its `rust-toolchain.toml` and
//! `.cargo/config.toml`) and built there with that toolchain alone.
//!
//! Last, ferrofuse-candle: it builds candle with its CUDA feature, which needs nvcc and the
//! CUDA libraries to link (`tools::candle_cuda` installs the CUDA 13.0 wheels into `.tools/`),
//! so the workspace steps above leave it out and this step lints it and runs its tests on
//! their own: the CPU-side tests (candle `Layout` to `MatDesc`) run, the GPU tests skip with a
//! printed reason, and the doc example and examples are built.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use crate::tools;

/// When `cargo xtask ci` started, for the elapsed time in each step's banner.
static START: OnceLock<Instant> = OnceLock::new();

/// A step's banner, with the minutes since the start: CI's log then shows where its time
/// goes.
fn banner(title: &str) {
    let secs = START.get_or_init(Instant::now).elapsed().as_secs();
    eprintln!("\n== [{}:{:02}] {title}", secs / 60, secs % 60);
}

pub fn run() -> Result<(), String> {
    START.get_or_init(Instant::now);
    let cargo = tools::cargo();
    let root = tools::repo_root();
    let step = |title: &str, args: &[&str]| -> Result<(), String> {
        banner(&format!("{title}: cargo {}", args.join(" ")));
        tools::run(Command::new(&cargo).args(args).current_dir(&root))
    };
    step("format", &["fmt", "--all", "--", "--check"])?;
    step(
        "lint",
        &[
            "clippy",
            "--workspace",
            "--exclude",
            "ferrofuse-candle",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    // Among them the test that the committed PTX is what the kernel sources build.
    step(
        "tests",
        &["test", "--workspace", "--exclude", "ferrofuse-candle"],
    )?;
    banner("ptx: every arch fresh and checked with ptxas");
    crate::ptx::run(&crate::ptx::Args {
        check: true,
        ..Default::default()
    })?;
    let stable = Stable::install(&root)?;
    stable.build_downstream(&root)?;
    step(
        "package",
        &[
            "package",
            "-p",
            "ferrofuse-common",
            "-p",
            "ferrofuse",
            "--no-verify",
            "--allow-dirty",
        ],
    )?;
    check_crate_sizes(&root)?;
    stable.build_packages(&root)?;
    candle(&cargo, &root)?;
    banner("done");
    Ok(())
}

/// crates.io refuses a `.crate` file over 10 MiB, and `ferrofuse` carries the PTX of every
/// arch: a kernel change that grows it past the limit must fail here, not at publishing.
fn check_crate_sizes(root: &Path) -> Result<(), String> {
    const LIMIT: u64 = 10 << 20;
    let version = workspace_value(root, "version")?;
    for name in ["ferrofuse-common", "ferrofuse"] {
        let krate = root.join(format!("target/package/{name}-{version}.crate"));
        let bytes = std::fs::metadata(&krate)
            .map_err(|e| format!("{}: {e}", krate.display()))?
            .len();
        eprintln!("{name}-{version}.crate: {bytes} bytes (crates.io takes up to {LIMIT})");
        if bytes > LIMIT {
            return Err(format!(
                "{}: {bytes} bytes, over crates.io's limit of {LIMIT}",
                krate.display()
            ));
        }
    }
    Ok(())
}

/// ferrofuse-candle with candle's CUDA build: clippy (warnings denied) on every target, then
/// its tests (CPU tests run, GPU tests skip without a driver).
fn candle(cargo: &str, root: &Path) -> Result<(), String> {
    banner("candle: the CUDA 13.0 wheels in .tools/cuda");
    let cuda = tools::candle_cuda()?;
    for (title, args) in [
        (
            "candle lint",
            &[
                "clippy",
                "-p",
                "ferrofuse-candle",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ][..],
        ),
        ("candle tests", &["test", "-p", "ferrofuse-candle"][..]),
    ] {
        banner(&format!("{title}: cargo {}", args.join(" ")));
        let mut cmd = Command::new(cargo);
        cuda.apply(&mut cmd);
        tools::run(cmd.args(args).current_dir(root))?;
    }
    Ok(())
}

/// The stable toolchain of the workspace's `rust-version`, run outside the repository.
struct Stable {
    toolchain: String,
    /// A fresh folder outside the repository for the copies that are built.
    scratch: PathBuf,
}

impl Stable {
    fn install(root: &Path) -> Result<Self, String> {
        let toolchain = msrv(root)?;
        banner(&format!("stable: rustup toolchain install {toolchain}"));
        tools::run(
            Command::new("rustup")
                .args(["toolchain", "install", &toolchain, "--profile", "minimal"])
                .env_remove("RUSTUP_TOOLCHAIN"),
        )?;
        let scratch = std::env::temp_dir().join(format!("ferrofuse-ci-{}", std::process::id()));
        if scratch.exists() {
            std::fs::remove_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        }
        std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        Ok(Self { toolchain, scratch })
    }

    /// `cargo` on this toolchain in `dir`, with nothing of the outer nightly build inherited:
    /// no cargo or rustc paths, no toolchain override, no nightly directory on `PATH`, and not
    /// this repository's CUDA version pin (a user's build picks its own).
    fn cargo(&self, dir: &Path, target_dir: &Path, args: &[&str]) -> Result<(), String> {
        banner(&format!(
            "stable {}: cargo {}",
            self.toolchain,
            args.join(" ")
        ));
        let mut cmd = Command::new("cargo");
        for (var, _) in std::env::vars_os() {
            let name = var.to_string_lossy();
            let inherited = (name.starts_with("CARGO") && name != "CARGO_HOME")
                || name.starts_with("RUSTUP_TOOLCHAIN")
                || matches!(
                    &*name,
                    "RUSTC" | "RUSTDOC" | "RUSTFLAGS" | "RUSTC_WRAPPER" | "CUDARC_CUDA_VERSION"
                );
            if inherited {
                cmd.env_remove(&var);
            }
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        let path = std::env::join_paths(
            std::env::split_paths(&path).filter(|p| !p.to_string_lossy().contains("nightly")),
        )
        .map_err(|e| e.to_string())?;
        // Without debug info: these builds only have to compile (and the downstream crate
        // run once), and they share the CI machine's disk with everything else.
        cmd.args(args)
            .env("RUSTUP_TOOLCHAIN", &self.toolchain)
            .env("CARGO_PROFILE_DEV_DEBUG", "false")
            .env("CARGO_INCREMENTAL", "0")
            .env("CARGO_TARGET_DIR", target_dir)
            .env("PATH", path)
            .current_dir(dir);
        tools::run(&mut cmd)
    }

    /// A user's crate depending on `ferrofuse` by path: built and run as it is, then checked
    /// with cudarc's `dynamic-linking` as candle enables it (no libcuda to link here).
    fn build_downstream(&self, root: &Path) -> Result<(), String> {
        let dir = self.scratch.join("downstream");
        copy_dir(&root.join("tests/downstream"), &dir)?;
        let manifest = dir.join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest).map_err(|e| e.to_string())?;
        let host = root.join("host");
        let text = text.replace(
            "path = \"../../host\"",
            &format!("path = {:?}", host.display().to_string()),
        );
        std::fs::write(&manifest, text).map_err(|e| e.to_string())?;
        let target = root.join("target/ci-stable/downstream");
        self.cargo(&dir, &target, &["run", "--quiet"])?;
        self.cargo(&dir, &target, &["check", "--features", "candle-cudarc"])
    }

    /// The `.crate` files `cargo package` wrote, unpacked and built (library, tests, examples,
    /// benches) as a registry user would get them; `ferrofuse-common` is not on crates.io
    /// yet, so the unpacked copy stands in for it.
    fn build_packages(&self, root: &Path) -> Result<(), String> {
        let version = workspace_value(root, "version")?;
        let unpacked = self.scratch.join("packages");
        std::fs::create_dir_all(&unpacked).map_err(|e| e.to_string())?;
        for name in ["ferrofuse-common", "ferrofuse"] {
            let krate = root.join(format!("target/package/{name}-{version}.crate"));
            tools::run(
                Command::new("tar")
                    .arg("xzf")
                    .arg(&krate)
                    .arg("-C")
                    .arg(&unpacked),
            )?;
        }
        let patch = format!(
            "patch.crates-io.ferrofuse-common.path={:?}",
            unpacked
                .join(format!("ferrofuse-common-{version}"))
                .display()
                .to_string()
        );
        self.cargo(
            &unpacked.join(format!("ferrofuse-{version}")),
            &root.join("target/ci-stable/packages"),
            &["build", "--all-targets", "--config", &patch],
        )?;
        // The stable builds are not reused: their gigabytes go before the candle build.
        std::fs::remove_dir_all(&self.scratch).map_err(|e| e.to_string())?;
        std::fs::remove_dir_all(root.join("target/ci-stable")).map_err(|e| e.to_string())
    }
}

/// The toolchain CI builds users' crates with: the workspace's `rust-version`.
fn msrv(root: &Path) -> Result<String, String> {
    workspace_value(root, "rust-version")
}

/// A `key = "value"` line of the workspace manifest's `[workspace.package]`.
fn workspace_value(root: &Path, key: &str) -> Result<String, String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).map_err(|e| e.to_string())?;
    manifest
        .split("[workspace.package]")
        .nth(1)
        .and_then(|table| {
            table.lines().find_map(|line| {
                let (k, v) = line.split_once('=')?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
            })
        })
        .ok_or(format!("no {key} in [workspace.package] of Cargo.toml"))
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for entry in std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        let dest = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &dest)?;
        } else {
            std::fs::copy(entry.path(), &dest)
                .map_err(|e| format!("{}: {e}", entry.path().display()))?;
        }
    }
    Ok(())
}
