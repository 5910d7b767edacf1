//! Paths of the repository and of the tools installed into its git-ignored `.tools/`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// ptxas from the PyPI wheel matching the GPU machines' CUDA 13.0 driver (PTX ISA <= 9.0).
const NVCC_WHEEL: &str = "nvidia-cuda-nvcc==13.0.88";

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Runs a command, failing with its command line if it fails.
pub fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !status.success() {
        return Err(format!("{cmd:?} failed ({status})"));
    }
    Ok(())
}

/// The cargo that runs this xtask (`$CARGO`), else `cargo`.
pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The Python to run (`$PYTHON`), else `python3`.
pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Builds `ferrofuse-bench` in release and returns the executable.
pub fn build_bench(root: &Path) -> Result<PathBuf, String> {
    run(Command::new(cargo())
        .args(["build", "--release", "--quiet", "-p", "ferrofuse-bench"])
        .current_dir(root))?;
    Ok(root.join("target/release/ferrofuse-bench"))
}

/// The ptxas binary, installing the wheel into `.tools/nvcc` first if it is not there.
pub fn ptxas() -> Result<PathBuf, String> {
    let dir = repo_root().join(".tools/nvcc");
    let ptxas = dir.join("nvidia/cu13/bin/ptxas");
    if ptxas.exists() {
        return Ok(ptxas);
    }
    eprintln!(
        "xtask: installing ptxas ({NVCC_WHEEL}) into {}",
        dir.display()
    );
    run(Command::new(python())
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
        ])
        .arg(&dir)
        .arg(NVCC_WHEEL))
    .map_err(|e| {
        format!("could not install ptxas with pip ({e}); needs python3 with pip and PyPI access")
    })?;
    if !ptxas.exists() {
        return Err(format!(
            "{NVCC_WHEEL} installed but {} is missing",
            ptxas.display()
        ));
    }
    Ok(ptxas)
}
