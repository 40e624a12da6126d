//! Shell completions and the manual page, from the binary: bash loads the
//! completion (`complete -p leader-elector`), zsh's and fish's scripts name
//! the command, `man ./leader-elector.1` renders; `-h` fits a screen.

use std::process::Command;

fn bin(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_leader-elector"))
        .args(args)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn completions_load_in_bash_and_name_the_command_in_zsh_and_fish() {
    let dir = tempfile::TempDir::new().unwrap();
    let script = dir.path().join("leader-elector.bash");
    std::fs::write(&script, bin(&["completions", "bash"])).unwrap();
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source '{}' && complete -p leader-elector",
            script.display()
        ))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("leader-elector"), "{text}");
    assert!(bin(&["completions", "zsh"]).starts_with("#compdef leader-elector"));
    assert!(bin(&["completions", "fish"]).contains("complete -c leader-elector"));
}

#[test]
fn the_manual_page_renders_with_man() {
    let dir = tempfile::TempDir::new().unwrap();
    let page = dir.path().join("leader-elector.1");
    std::fs::write(&page, bin(&["man"])).unwrap();
    let out = Command::new("man")
        .arg(&page)
        .env("MANWIDTH", "100")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .output()
        .expect("man (scripts/install-deps installs man-db)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("leader-elector"), "{text}");
    assert!(text.contains("--lease-duration"), "{text}");
}

#[test]
fn short_help_fits_a_screen_and_long_help_lines_fit_100_columns() {
    let short = bin(&["-h"]);
    assert!(
        short.lines().count() <= 60,
        "{} lines:\n{short}",
        short.lines().count()
    );
    for args in [&["--help"][..], &["run", "--help"], &["status", "--help"]] {
        for line in bin(args).lines() {
            assert!(line.chars().count() <= 100, "{args:?}: {line}");
        }
    }
}

/// `pause`, `resume` and `switchover` write the election's controls: their
/// `--help` says so (it said "Name of the election to read").
#[test]
fn pause_and_switchover_help_say_the_election_is_controlled() {
    for cmd in ["pause", "resume", "switchover"] {
        let help = bin(&[cmd, "--help"]);
        let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            words.contains("--election <NAME> Name of the election to read (status, observe) or to control (pause, resume, switchover)"),
            "{cmd} --help: {help}"
        );
    }
}
