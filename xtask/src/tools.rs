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
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    run(Command::new(&python)
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
