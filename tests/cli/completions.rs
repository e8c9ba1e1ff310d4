//! Shell completions and man pages generated from the clap definitions,
//! checked with the real bash, groff and man.
use std::process::Command as Std;

use assert_cmd::Command;

fn stdout_of(args: &[&str]) -> String {
    let o = Command::cargo_bin("pgbelow")
        .unwrap()
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "pgbelow {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Source the script in bash and complete `words` (the last one being typed).
fn bash_complete(script: &std::path::Path, words: &[&str]) -> Vec<String> {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let prog = format!(
        "set -u; source '{}' || exit 9; complete -p pgbelow >&2 || exit 8; \
         COMP_WORDS=({}); COMP_CWORD={}; COMP_LINE='{}'; COMP_POINT=${{#COMP_LINE}}; \
         _pgbelow pgbelow '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        script.display(),
        quoted.join(" "),
        words.len() - 1,
        words.join(" "),
        words[words.len() - 1],
        words[words.len().saturating_sub(2)],
    );
    let o = Std::new("bash").args(["-c", &prog]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "bash failed ({:?}): {err}", o.status);
    assert!(err.contains("-F _pgbelow pgbelow"), "complete -p: {err}");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completion_sources_and_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("pgbelow.bash");
    std::fs::write(&script, stdout_of(&["completions", "bash"])).unwrap();

    let subs = bash_complete(&script, &["pgbelow", "re"]);
    assert!(subs.contains(&"record".to_string()), "{subs:?}");
    assert!(subs.contains(&"report".to_string()), "{subs:?}");
    assert!(!subs.contains(&"lab".to_string()), "{subs:?}");

    let flags = bash_complete(&script, &["pgbelow", "report", "DIR", "--fo"]);
    assert!(flags.contains(&"--format".to_string()), "{flags:?}");
    let formats = bash_complete(&script, &["pgbelow", "report", "DIR", "--format", ""]);
    for f in ["text", "json", "html", "pprof"] {
        assert!(formats.contains(&f.to_string()), "{f}: {formats:?}");
    }
}

#[test]
fn every_shell_has_a_script() {
    for (shell, marker) in [
        ("zsh", "#compdef pgbelow"),
        ("fish", "complete -c pgbelow"),
        ("elvish", "edit:completion:arg-completer[pgbelow]"),
        ("powershell", "Register-ArgumentCompleter"),
    ] {
        let s = stdout_of(&["completions", shell]);
        assert!(s.contains(marker), "{shell}: no {marker}");
        assert!(s.contains("record") && s.contains("doctor"), "{shell}");
    }
}

/// groff's warnings (-ww) on stderr: none is allowed.
fn groff_warnings(page: &[u8]) -> String {
    use std::io::Write;
    let mut child = Std::new("groff")
        // -k: preconv, as man-db does (the help texts hold UTF-8 dashes and ellipses).
        .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("groff (apt-get install groff-base)");
    child.stdin.take().unwrap().write_all(page).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn man_pages_render_without_warnings() {
    let page = stdout_of(&["man"]);
    assert!(
        page.starts_with(".ie") || page.contains(".TH pgbelow"),
        "roff"
    );
    assert_eq!(groff_warnings(page.as_bytes()), "");

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("man1");
    stdout_of(&["man", "--output", dir.to_str().unwrap()]);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    for want in [
        "pgbelow.1",
        "pgbelow-record.1",
        "pgbelow-report.1",
        "pgbelow-lab-run.1",
    ] {
        assert!(names.contains(&want.to_string()), "{want}: {names:?}");
    }
    for n in &names {
        let text = std::fs::read(dir.join(n)).unwrap();
        assert_eq!(groff_warnings(&text), "", "{n}");
    }

    // man-db renders the report page with its options.
    if Std::new("man").arg("--version").output().is_ok() {
        let o = Std::new("man")
            .args(["-l", "-Tutf8"])
            .arg(dir.join("pgbelow-report.1"))
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(
            text.contains("--format") && text.contains("pprof"),
            "{text}"
        );
    } else {
        eprintln!("skipped the man -l check: man-db not installed");
    }
}
