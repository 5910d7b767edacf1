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
    pip_install(&dir, &[NVCC_WHEEL], "ptxas")?;
    if !ptxas.exists() {
        return Err(format!(
            "{NVCC_WHEEL} installed but {} is missing",
            ptxas.display()
        ));
    }
    Ok(ptxas)
}

/// `pip install --no-deps --target dir wheels...`: the wheels' files only, outside any Python
/// environment, so nothing else on the machine changes (no pip cache either: the CUDA wheels
/// would take their gigabyte twice).
fn pip_install(dir: &Path, wheels: &[&str], what: &str) -> Result<(), String> {
    run(Command::new(python())
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-cache-dir",
            "--no-deps",
            "--target",
        ])
        .arg(dir)
        .args(wheels))
    .map_err(|e| {
        format!("could not install {what} with pip ({e}); needs python3 with pip and PyPI access")
    })
}

/// The CUDA 13.0 wheels ferrofuse-candle is built with, installed into `.tools/cuda`:
/// candle-kernels compiles its `.cu` files with nvcc (nvcc, cicc, the CRT and runtime headers,
/// CCCL), and with candle's cudarc `dynamic-linking` every binary links libcublas,
/// libcublasLt, libcurand, libnvrtc (these wheels) and libcuda (a stub, see
/// [`candle_cuda`]), and candle-kernels links libcudart. 13.0 to match the driver of the GPU
/// machines (newer PTX does not load there).
pub const CANDLE_WHEELS: [&str; 8] = [
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-cublas==13.0.2.14",
    "nvidia-curand==10.4.0.35",
    "nvidia-cuda-nvrtc==13.0.88",
];

/// What a candle CUDA build needs in its environment.
pub struct CandleCuda {
    /// The toolkit tree of the wheels (`CUDA_HOME`): `bin/nvcc`, `include/`, `lib/`.
    pub home: PathBuf,
    /// Unversioned `lib*.so` names for the linker, and the libcuda stub.
    pub link: PathBuf,
    /// The libcuda stub alone (`libcuda.so.1`), for running CPU-only tests without a driver.
    pub stub: PathBuf,
}

impl CandleCuda {
    /// Sets the variables of a candle CUDA build on `cmd`: `CUDA_HOME`, nvcc on `PATH`,
    /// `CUDA_COMPUTE_CAP` (90 unless already set: there may be no GPU to ask), the link
    /// directories (`LIBRARY_PATH`), and where the test executables find the libraries when
    /// run here (`LD_LIBRARY_PATH`; the libcuda stub only when the machine has no driver).
    pub fn apply(&self, cmd: &mut Command) {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.home.join("bin")];
        dirs.extend(std::env::split_paths(&path));
        cmd.env("CUDA_HOME", &self.home)
            .env("PATH", std::env::join_paths(dirs).unwrap_or(path))
            .env("LIBRARY_PATH", join(&[&self.link, &self.home.join("lib")]));
        if std::env::var_os("CUDA_COMPUTE_CAP").is_none() {
            cmd.env("CUDA_COMPUTE_CAP", "90");
        }
        let lib = self.home.join("lib");
        let mut run: Vec<&Path> = vec![&lib];
        if !has_driver() {
            run.push(&self.stub);
        }
        cmd.env("LD_LIBRARY_PATH", join(&run));
    }
}

impl CandleCuda {
    /// The variables of [`CandleCuda::apply`] as shell `export` lines.
    pub fn print_env(&self) {
        let mut cmd = Command::new("true");
        self.apply(&mut cmd);
        for (k, v) in cmd.get_envs() {
            if let Some(v) = v {
                println!("export {}={:?}", k.to_string_lossy(), v.to_string_lossy());
            }
        }
    }
}

fn join(dirs: &[&Path]) -> std::ffi::OsString {
    std::env::join_paths(dirs).unwrap_or_default()
}

/// Whether the dynamic linker knows a libcuda (a CUDA driver is installed).
fn has_driver() -> bool {
    Command::new("ldconfig")
        .arg("-p")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so.1"))
}

/// The CUDA wheels for ferrofuse-candle in `.tools/cuda` (installed on first use), with the
/// link directory: unversioned names of the wheels' libraries and a libcuda stub. The stub
/// is built here from the wheel's `cuda.h`, as the toolkit's `lib/stubs/libcuda.so` is: every
/// driver function, each returning `CUDA_ERROR_STUB_LIBRARY`; binaries record `libcuda.so.1`
/// and get the driver's at run time.
pub fn candle_cuda() -> Result<CandleCuda, String> {
    let dir = repo_root().join(".tools/cuda");
    let home = dir.join("nvidia/cu13");
    let link = dir.join("link");
    let stub = dir.join("stub");
    let marker = dir.join("installed.txt");
    let wanted = CANDLE_WHEELS.join("\n");
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(wanted.as_str()) {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        eprintln!(
            "xtask: installing the CUDA 13.0 wheels for candle into {}",
            dir.display()
        );
        pip_install(&dir, &CANDLE_WHEELS, "the CUDA wheels")?;
        std::fs::create_dir_all(&link).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&stub).map_err(|e| e.to_string())?;
        for (name, target) in [
            ("libcublas.so", "libcublas.so.13"),
            ("libcublasLt.so", "libcublasLt.so.13"),
            ("libcurand.so", "libcurand.so.10"),
            ("libnvrtc.so", "libnvrtc.so.13"),
            ("libcudart.so", "libcudart.so.13"),
        ] {
            let target = home.join("lib").join(target);
            if !target.exists() {
                return Err(format!("the CUDA wheels have no {}", target.display()));
            }
            symlink(&target, &link.join(name))?;
        }
        libcuda_stub(&home, &stub)?;
        symlink(&stub.join("libcuda.so.1"), &link.join("libcuda.so"))?;
        std::fs::write(&marker, wanted).map_err(|e| e.to_string())?;
    }
    Ok(CandleCuda { home, link, stub })
}

/// `stub/libcuda.so.1`: every `CUresult cu*(...)` that `cuda.h` declares (after its macros,
/// so the `_v2` names), returning 34 (`CUDA_ERROR_STUB_LIBRARY`).
fn libcuda_stub(home: &Path, stub: &Path) -> Result<(), String> {
    let header = stub.join("cuda_h.c");
    std::fs::write(&header, "#include <cuda.h>\n").map_err(|e| e.to_string())?;
    let out = Command::new("cc")
        .args(["-E", "-P", "-I"])
        .arg(home.join("include"))
        .arg(&header)
        .output()
        .map_err(|e| format!("running cc -E: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cc -E cuda.h failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut names: Vec<&str> = text
        .split("CUresult")
        .skip(1)
        .filter_map(|rest| {
            let rest = rest.trim_start();
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            let (name, after) = rest.split_at(end);
            (name.starts_with("cu") && after.trim_start().starts_with('(')).then_some(name)
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    if names.len() < 100 {
        return Err(format!(
            "only {} driver functions found in cuda.h",
            names.len()
        ));
    }
    let source: String = names
        .iter()
        .map(|n| format!("int {n}(void) {{ return 34; }}\n"))
        .collect();
    let c = stub.join("libcuda_stub.c");
    std::fs::write(&c, source).map_err(|e| e.to_string())?;
    run(Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(stub.join("libcuda.so.1"))
        .arg(&c))
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).map_err(|e| format!("{}: {e}", link.display()))
}

#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> Result<(), String> {
    std::fs::copy(target, link)
        .map(|_| ())
        .map_err(|e| format!("{}: {e}", link.display()))
}
