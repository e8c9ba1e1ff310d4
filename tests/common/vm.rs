//! A virtual machine for what this host cannot give: the unified cgroup
//! hierarchy (this kernel mounts cgroup v1) and a clocksource the vDSO
//! cannot read. Debian's cloud kernel (tests/vm/kernel.sh, fetched once
//! without installing it) boots under qemu's software emulation with the
//! whole root filesystem as an initramfs (tests/vm/initramfs.sh: busybox,
//! this host's PostgreSQL 15, the pgbelow under test) and an ext4 disk
//! for the data directories (TMPDIR), runs a script as root and powers off; the script's output comes back on the serial
//! console. KVM does not work on this kind of machine, so the guest runs
//! about 15× slower than the host: scale work down.
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct Vm {
    kernel: PathBuf,
    root: PathBuf,
}

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vm")
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Vm {
    /// The kernel and the root filesystem for the pgbelow under test; None
    /// (skipped) without root or qemu outside CI, where scripts/setup
    /// installs qemu.
    pub fn build() -> Option<Vm> {
        if super::skipped_unless_root("the VM's root filesystem holds root-owned files") {
            return None;
        }
        let tools = ["qemu-system-x86_64", "busybox", "cpio", "objcopy"];
        if let Some(t) = tools.iter().find(|t| !have(t)) {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{t} is missing in CI: scripts/setup installs qemu-system-x86, busybox-static and cpio"
            );
            eprintln!("skipped: {t} not installed (run scripts/setup)");
            return None;
        }
        let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vm");
        let o = Command::new("bash")
            .arg(here().join("kernel.sh"))
            .arg(&cache)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "tests/vm/kernel.sh: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let kernel = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        let pgbelow = assert_cmd::cargo::cargo_bin("pgbelow");
        let root = cache.join("root.cpio");
        let stale = |p: &Path| {
            let m = |q: &Path| std::fs::metadata(q).and_then(|m| m.modified()).ok();
            let built = m(p);
            built.is_none()
                || [
                    pgbelow.clone(),
                    here().join("init"),
                    here().join("initramfs.sh"),
                ]
                .iter()
                .any(|q| m(q) > built)
        };
        if stale(&root) {
            let o = Command::new("bash")
                .arg(here().join("initramfs.sh"))
                .arg(&root)
                .arg(&pgbelow)
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "tests/vm/initramfs.sh: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Some(Vm { kernel, root })
    }

    /// Boots with `cmdline` added to the kernel's command line, runs
    /// `script` as /test.sh and returns the console (without `\r`). Panics
    /// with the console so far after `timeout`.
    pub fn run(&self, script: &str, cmdline: &str, timeout: Duration) -> String {
        let dir = tempfile::tempdir().unwrap();
        // The script as a second archive after the root's: the kernel
        // unpacks concatenated initramfs archives in order.
        std::fs::write(dir.path().join("test.sh"), script).unwrap();
        let mut cpio = Command::new("cpio")
            .args(["-o", "-H", "newc", "--quiet"])
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        cpio.stdin.take().unwrap().write_all(b"test.sh\n").unwrap();
        let mut extra = Vec::new();
        cpio.stdout.take().unwrap().read_to_end(&mut extra).unwrap();
        assert!(cpio.wait().unwrap().success());
        let initrd = dir.path().join("initrd.cpio");
        let mut all = std::fs::read(&self.root).unwrap();
        all.extend_from_slice(&extra);
        std::fs::write(&initrd, all).unwrap();
        // A disk for the data directories (the initramfs is tmpfs, whose
        // pages no reclaim can drop): a sparse ext4 image on NVMe, which the
        // cloud kernel drives without modules.
        let disk = dir.path().join("disk.img");
        std::fs::File::create(&disk)
            .unwrap()
            .set_len(4 << 30)
            .unwrap();
        let mkfs = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&disk)
            .status()
            .unwrap();
        assert!(mkfs.success(), "mkfs.ext4 {}", disk.display());
        let console = dir.path().join("console");
        let mut q = Command::new("qemu-system-x86_64")
            .args(["-m", "3072", "-smp", "2", "-no-reboot"])
            .args(["-display", "none", "-monitor", "none"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-kernel")
            .arg(&self.kernel)
            .arg("-initrd")
            .arg(&initrd)
            .arg("-drive")
            .arg(format!(
                "file={},if=none,id=disk,format=raw",
                disk.display()
            ))
            .args(["-device", "nvme,serial=pgbelow,drive=disk"])
            .args([
                "-append",
                &format!("console=ttyS0 quiet panic=-1 {cmdline}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        let read = || {
            String::from_utf8_lossy(&std::fs::read(&console).unwrap_or_default()).replace('\r', "")
        };
        loop {
            if let Some(status) = q.try_wait().unwrap() {
                let out = read();
                assert!(status.success(), "qemu exited with {status}: {out}");
                eprintln!("VM: {:.0} s", t0.elapsed().as_secs_f64());
                return out;
            }
            if t0.elapsed() > timeout {
                let _ = q.kill();
                let _ = q.wait();
                panic!("the VM ran past {timeout:?}; console:\n{}", read());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The text the guest printed between `==> name` and `<== name`.
pub fn section<'a>(console: &'a str, name: &str) -> Option<&'a str> {
    let start = console.find(&format!("==> {name}\n"))? + name.len() + 5;
    let end = console[start..].find(&format!("<== {name}"))? + start;
    Some(&console[start..end])
}
