//! The Debian package of `scripts/package-deb.sh` through its life (issue 35), as root with the
//! real dpkg: revision 1 installed, checked (stripped binary with its debug symbols in
//! `sluice-dbgsym`, `Depends` from the binary's links, files, example configs for every role,
//! the node run as its unit would run it), upgraded to revision 2 (running units restarted),
//! removed (units stopped, conffiles kept) and purged (nothing left, the user gone); lintian
//! reports nothing on either package.
//!
//! PID 1 is not systemd here, so `systemctl`, `deb-systemd-invoke` and `deb-systemd-helper` are
//! stand-ins on `PATH` that record their calls, and "systemd is running" (the maintainer
//! scripts' `[ -d /run/systemd/system ]`) is a tmpfs on `/run` in a mount namespace of dpkg's
//! own, so the host's `/run` is never touched.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use test_support::{is_root, prerequisite, SluiceLauncher, ROOT_IN_CI};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const UNITS: &str =
    "sluice-agent.service sluice-controlplane.service sluice-node.service sluice-vm-agent.service";
const EXAMPLES: &str = "/usr/share/doc/sluice/examples";

#[test]
fn the_debian_package_installs_upgrades_and_purges_cleanly() {
    if !prerequisite("root (dpkg installs the package)", is_root(), ROOT_IN_CI) {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    // Both revisions of the same binary at once (each build is mostly one objcopy).
    let first = build(out.path(), 1);
    let second = build(out.path(), 2);
    let (deb, dbgsym) = finish(first);
    let (upgrade, _) = finish(second);
    let lintian = Command::new("lintian")
        .args(["--display-info", "--pedantic", "--display-experimental"])
        .args(["--fail-on", "error,warning,info,pedantic,experimental"])
        .args(["--tag-display-limit", "0"])
        // Not checked: the binary's read-only data holds its crates' strings end to end with no
        // separator, and lintian's speller reads across them ("... should find a match" running
        // into a string that starts with "IN" read as "matchIN"). Which strings touch depends
        // on each build's layout, so an override of one such hit is unused in the next build,
        // which lintian reports too.
        .args(["--suppress-tags", "spelling-error-in-binary"])
        .args([&deb, &dbgsym])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lintian is installed (scripts/test.sh installs it)");
    let systemd = FakeSystemd::new();
    let _purge = Purged;

    // Without systemd the scripts call none of its tools but the state helper.
    assert!(systemd.dpkg(false, &["--install", &deb]).status.success());
    let calls = systemd.take_calls();
    assert!(
        calls
            .iter()
            .all(|call| call.starts_with("deb-systemd-helper update-state ")),
        "{calls:?}"
    );
    installed_files();
    stripped_with_debug_symbols(Path::new(&dbgsym));
    depends_from_links();
    examples_pass_their_checks();
    the_node_runs_as_its_unit_would();

    // Upgrade: the units that run are restarted on the new binary, none is stopped first.
    let secret = std::fs::read("/etc/sluice/jwt.secret").unwrap();
    edit_conffile();
    assert!(systemd
        .dpkg(true, &["--install", &upgrade])
        .status
        .success());
    let calls = systemd.take_calls();
    assert!(
        calls.contains(&format!("deb-systemd-invoke try-restart {UNITS}")),
        "{calls:?}"
    );
    assert!(calls.contains(&"systemctl --system daemon-reload".to_string()));
    assert!(
        !calls.iter().any(|call| call.contains(" stop ")),
        "{calls:?}"
    );
    assert_eq!(query("${Version}"), "0.1.0-2");
    assert_eq!(std::fs::read("/etc/sluice/jwt.secret").unwrap(), secret);
    assert!(conffile_edited());

    // Remove: the units stop; the binary goes, the configuration stays.
    assert!(systemd.dpkg(true, &["--remove", "sluice"]).status.success());
    let calls = systemd.take_calls();
    assert!(
        calls.contains(&format!("deb-systemd-invoke stop {UNITS}")),
        "{calls:?}"
    );
    assert!(!Path::new("/usr/bin/sluice").exists());
    assert!(conffile_edited() && Path::new("/etc/sluice/jwt.secret").exists());
    assert_eq!(query("${db:Status-Abbrev}").trim(), "rc");

    // Purge: nothing of the package is left.
    assert!(systemd.dpkg(true, &["--purge", "sluice"]).status.success());
    let calls = systemd.take_calls();
    assert!(
        calls.contains(&format!("deb-systemd-helper purge {UNITS}")),
        "{calls:?}"
    );
    for gone in ["/etc/sluice", "/var/lib/sluice", "/usr/share/doc/sluice"] {
        assert!(!Path::new(gone).exists(), "{gone} is left after the purge");
    }
    for database in ["passwd", "group"] {
        let entry = Command::new("getent")
            .args([database, "sluice"])
            .output()
            .unwrap();
        assert!(!entry.status.success(), "sluice is left in {database}");
    }
    assert!(!Command::new("dpkg-query")
        .args(["-W", "sluice"])
        .output()
        .unwrap()
        .status
        .success());

    let lintian = lintian.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&lintian.stdout);
    assert!(
        lintian.status.success() && !said.lines().any(|line| line.contains(": ")),
        "lintian: {said}{}",
        String::from_utf8_lossy(&lintian.stderr)
    );
}

/// Starts `scripts/package-deb.sh` on the test binary for Debian revision `revision`.
fn build(out: &Path, revision: u32) -> Child {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/package-deb.sh");
    Command::new(script)
        .args([
            "--binary",
            BIN,
            "--fast",
            "--revision",
            &revision.to_string(),
            "--out",
        ])
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The package and its debug symbols package, as the script printed them.
fn finish(build: Child) -> (String, String) {
    let built = build.wait_with_output().unwrap();
    assert!(built.status.success(), "{built:?}");
    let stdout = String::from_utf8(built.stdout).unwrap();
    let paths: Vec<&str> = stdout.lines().collect();
    assert_eq!(paths.len(), 2, "{stdout}");
    assert!(paths[1].contains("/sluice-dbgsym_"), "{stdout}");
    (paths[0].to_string(), paths[1].to_string())
}

/// `systemctl`, `deb-systemd-invoke` and `deb-systemd-helper` that append their arguments to
/// a log, first on dpkg's `PATH` (dpkg passes it to the maintainer scripts).
struct FakeSystemd {
    dir: tempfile::TempDir,
}

impl FakeSystemd {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("calls.log");
        for tool in ["systemctl", "deb-systemd-invoke", "deb-systemd-helper"] {
            let path = dir.path().join(tool);
            std::fs::write(
                &path,
                format!("#!/bin/sh\necho \"{tool} $*\" >> '{}'\n", log.display()),
            )
            .unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Self { dir }
    }

    /// The calls since the last take, one line each.
    fn take_calls(&self) -> Vec<String> {
        let log = self.dir.path().join("calls.log");
        let calls = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        calls.lines().map(str::to_string).collect()
    }

    /// dpkg with these tools, in a mount namespace of its own: a `/run` that holds
    /// `/run/systemd/system` if `systemd_running`, and an empty `/var/lib/man-db`, so man-db's
    /// trigger (a few seconds of reindexing the host's pages per dpkg run) finds no
    /// `auto-update` and leaves the host's index as it was.
    fn dpkg(&self, systemd_running: bool, args: &[&str]) -> Output {
        let path = format!(
            "{}:{}",
            self.dir.path().display(),
            std::env::var("PATH").unwrap()
        );
        let output = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(
                "mount -t tmpfs sluice-test /run && \
                 if [ -d /var/lib/man-db ]; then mount -t tmpfs sluice-test /var/lib/man-db; fi && \
                 if [ \"$SYSTEMD_RUNNING\" = yes ]; then mkdir /run/systemd /run/systemd/system; fi && \
                 exec dpkg \"$@\"",
            )
            .arg("sh")
            .args(args)
            .env("PATH", path)
            .env("SYSTEMD_RUNNING", if systemd_running { "yes" } else { "no" })
            .output()
            .unwrap();
        assert!(output.status.success(), "dpkg {args:?}: {output:?}");
        output
    }
}

/// Purges the package when the test ends, whatever happened.
struct Purged;

impl Drop for Purged {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", "sluice"]).output();
    }
}

/// A field of the installed package (`dpkg-query -W -f`).
fn query(format: &str) -> String {
    let output = Command::new("dpkg-query")
        .args(["-W", "-f", format, "sluice"])
        .output()
        .unwrap();
    String::from_utf8(output.stdout).unwrap()
}

fn edit_conffile() {
    let mut text = std::fs::read_to_string("/etc/sluice/node.yaml").unwrap();
    text.push_str("# edited by the operator\n");
    std::fs::write("/etc/sluice/node.yaml", text).unwrap();
}

fn conffile_edited() -> bool {
    std::fs::read_to_string("/etc/sluice/node.yaml")
        .is_ok_and(|text| text.ends_with("# edited by the operator\n"))
}

fn output_of(program: &str, args: &[&str]) -> String {
    let output = Command::new(program).args(args).output().unwrap();
    assert!(output.status.success(), "{program} {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The user, the secret, man pages and completions where man and the shells look, the
/// copyright and changelog where Debian keeps them, and a binary that runs.
fn installed_files() {
    output_of("getent", &["passwd", "sluice"]);
    let secret = std::fs::metadata("/etc/sluice/jwt.secret").unwrap();
    assert_eq!(secret.permissions().mode() & 0o777, 0o640);
    assert_eq!(
        output_of("man", &["-w", "sluice-run"]).trim(),
        "/usr/share/man/man1/sluice-run.1.gz"
    );
    for completion in [
        "/usr/share/bash-completion/completions/sluice",
        "/usr/share/zsh/vendor-completions/_sluice",
        "/usr/share/fish/vendor_completions.d/sluice.fish",
    ] {
        let script = std::fs::read_to_string(completion).unwrap();
        assert!(script.contains("check-config"), "{completion}");
    }
    let copyright = std::fs::read_to_string("/usr/share/doc/sluice/copyright").unwrap();
    assert!(copyright
        .starts_with("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"));
    // The workspace's licence, as Cargo.toml states it.
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml"))
            .unwrap();
    let license = manifest
        .lines()
        .find_map(|line| line.strip_prefix("license = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap();
    assert!(copyright.contains("\nFiles: *\nCopyright: "), "{copyright}");
    assert!(
        copyright.contains(&format!("\nLicense: {license}\n")),
        "{copyright}"
    );
    let changelog = output_of("zcat", &["/usr/share/doc/sluice/changelog.Debian.gz"]);
    assert!(changelog.starts_with("sluice (0.1.0-1) "), "{changelog}");
    let version = output_of("/usr/bin/sluice", &["--version"]);
    assert!(version.starts_with("sluice 0.1.0"), "{version}");
}

/// The installed binary has no debug sections and names its debug file, which
/// `sluice-dbgsym` holds where gdb looks it up by build id, with the debug info.
fn stripped_with_debug_symbols(dbgsym: &Path) {
    let file = output_of("file", &["/usr/bin/sluice"]);
    assert!(file.contains(", stripped"), "{file}");
    let sections = output_of(
        "readelf",
        &["--section-headers", "--wide", "/usr/bin/sluice"],
    );
    // (.debug_gdb_scripts is loaded with the program: Rust's pointer to its gdb helpers.)
    for gone in [".debug_info", ".debug_line", ".debug_str", ".symtab"] {
        assert!(!sections.contains(gone), "{gone}: {sections}");
    }
    let original = std::fs::metadata(BIN).unwrap().len();
    let installed = std::fs::metadata("/usr/bin/sluice").unwrap().len();
    eprintln!("binary: {original} bytes built, {installed} bytes installed");
    assert!(
        installed * 10 < original * 6,
        "{installed} of {original} bytes"
    );

    let notes = output_of("readelf", &["--notes", "/usr/bin/sluice"]);
    let build_id = notes
        .lines()
        .find_map(|line| line.trim().strip_prefix("Build ID: "))
        .unwrap()
        .to_string();
    let dbgsym = dbgsym.to_str().unwrap();
    assert_eq!(
        output_of("dpkg-deb", &["--field", dbgsym, "Build-Ids"]).trim(),
        build_id
    );
    assert_eq!(
        output_of("dpkg-deb", &["--field", dbgsym, "Depends"]).trim(),
        "sluice (= 0.1.0-1)"
    );
    let unpacked = tempfile::tempdir().unwrap();
    output_of(
        "dpkg-deb",
        &["--extract", dbgsym, unpacked.path().to_str().unwrap()],
    );
    let name = format!("{}.debug", &build_id[2..]);
    let debug = unpacked
        .path()
        .join("usr/lib/debug/.build-id")
        .join(&build_id[..2])
        .join(&name);
    let debug = debug.to_str().unwrap();
    let sections = output_of("readelf", &["--section-headers", "--wide", debug]);
    assert!(
        sections.contains(".debug_info") && sections.contains(".debug_line"),
        "{sections}"
    );
    let link = output_of(
        "readelf",
        &["--string-dump=.gnu_debuglink", "/usr/bin/sluice"],
    );
    assert!(link.contains(&name), "{link}");
}

/// `Depends` names exactly the packages of the libraries the binary loads (each at a minimum
/// version), and adduser for the maintainer scripts.
fn depends_from_links() {
    let mut linked: Vec<String> = output_of("ldd", &["/usr/bin/sluice"])
        .lines()
        .filter_map(|line| {
            let path = match line.split_once(" => ") {
                Some((_, target)) => target.split_whitespace().next(),
                None => line
                    .split_whitespace()
                    .next()
                    .filter(|p| p.starts_with('/')),
            }?;
            Some(owner(path))
        })
        .collect();
    linked.push("adduser".to_string());
    linked.sort();
    linked.dedup();
    let depends = query("${Depends}");
    let mut named: Vec<String> = depends
        .split(", ")
        .map(|dependency| dependency.split(' ').next().unwrap().to_string())
        .collect();
    named.sort();
    assert_eq!(named, linked, "Depends: {depends}");
    assert!(depends.contains("libc6 (>= "), "{depends}");
}

/// The package owning a library file (dpkg lists merged-/usr libraries under /lib).
fn owner(path: &str) -> String {
    let candidates = [path, path.strip_prefix("/usr").unwrap_or(path)];
    for candidate in candidates {
        let output = Command::new("dpkg")
            .args(["-S", candidate])
            .output()
            .unwrap();
        if output.status.success() {
            let text = String::from_utf8(output.stdout).unwrap();
            return text.split([':', ',']).next().unwrap().trim().to_string();
        }
    }
    panic!("no package owns {path}");
}

/// Each role's example passes the check its role has: `check-config` for the node, agent and
/// gateway files (with the files they name provided), `systemd-analyze verify` and a start for
/// the control plane's drop-in, and the VM agent's environment file sets what its unit reads.
fn examples_pass_their_checks() {
    let mut names: Vec<String> = std::fs::read_dir(EXAMPLES)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "agent.yaml",
            "gateway.yaml",
            "sluice-controlplane.conf",
            "vm-agent.env"
        ]
    );
    check_config(Path::new("/etc/sluice/node.yaml"));
    // The files the examples name in /etc/sluice, here in a directory of their own.
    let etc = tempfile::tempdir().unwrap();
    let certificates = test_support::Certificates::generate(&[]).unwrap();
    for ca in ["node-ca.crt", "controlplane-ca.crt"] {
        std::fs::copy(&certificates.ca_cert, etc.path().join(ca)).unwrap();
    }
    for token in ["agent.token", "gateway.token"] {
        std::fs::write(etc.path().join(token), "token").unwrap();
    }
    std::fs::create_dir(etc.path().join("credentials")).unwrap();
    for example in ["agent.yaml", "gateway.yaml"] {
        let text = std::fs::read_to_string(Path::new(EXAMPLES).join(example)).unwrap();
        let copy = etc.path().join(example);
        let here = format!("{}/", etc.path().display());
        std::fs::write(&copy, text.replace("/etc/sluice/", &here)).unwrap();
        check_config(&copy);
    }
    controlplane_drop_in();
    vm_agent_environment();
}

fn check_config(file: &Path) {
    let checked = Command::new("/usr/bin/sluice")
        .arg("check-config")
        .arg(file)
        .output()
        .unwrap();
    assert!(checked.status.success(), "{}: {checked:?}", file.display());
    assert_eq!(String::from_utf8_lossy(&checked.stdout), "ok\n");
}

/// The drop-in beside the installed unit passes `systemd-analyze verify`, and its command,
/// on a port and directory of the test's, serves a certificate for the name it adds.
fn controlplane_drop_in() {
    let units = tempfile::tempdir().unwrap();
    let unit = units.path().join("sluice-controlplane.service");
    std::fs::copy("/lib/systemd/system/sluice-controlplane.service", &unit).unwrap();
    let drop_in = units.path().join("sluice-controlplane.service.d");
    std::fs::create_dir(&drop_in).unwrap();
    let conf =
        std::fs::read_to_string(Path::new(EXAMPLES).join("sluice-controlplane.conf")).unwrap();
    std::fs::write(drop_in.join("local.conf"), &conf).unwrap();
    let verified = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit)
        .current_dir(units.path())
        .output()
        .unwrap();
    assert!(
        verified.status.success() && verified.stderr.is_empty(),
        "{verified:?}"
    );

    let exec = conf
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .unwrap();
    let data = tempfile::tempdir().unwrap();
    let exec = exec.replace("0.0.0.0:6443", "127.0.0.1:0").replace(
        "/var/lib/sluice/controlplane",
        data.path().to_str().unwrap(),
    );
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/bin/sluice"));
    let controlplane = SluiceLauncher::new("/usr/bin/sluice")
        .unwrap()
        .args(words)
        .spawn()
        .expect("the drop-in's control plane starts");
    let port = controlplane.address("controlplane").port();
    let answer = output_of(
        "curl",
        &[
            "--silent",
            "--max-time",
            "10",
            "--write-out",
            "%{http_code}",
            "--output",
            "/dev/null",
            "--resolve",
            &format!("controlplane.example.internal:{port}:127.0.0.1"),
            "--cacert",
            data.path().join("pki/ca.crt").to_str().unwrap(),
            &format!("https://controlplane.example.internal:{port}/readyz"),
        ],
    );
    assert_eq!(answer, "200");
}

/// Every `${VAR}` the VM agent's unit passes is set in the example environment file.
fn vm_agent_environment() {
    let env = std::fs::read_to_string(Path::new(EXAMPLES).join("vm-agent.env")).unwrap();
    let settings: Vec<(&str, &str)> = env
        .lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .map(|line| line.split_once('=').unwrap())
        .collect();
    let unit = std::fs::read_to_string("/lib/systemd/system/sluice-vm-agent.service").unwrap();
    assert_eq!(
        unit_setting(&unit, "EnvironmentFile"),
        "/etc/sluice/vm-agent.env"
    );
    let exec = unit_setting(&unit, "ExecStart");
    let used: Vec<&str> = exec
        .split("${")
        .skip(1)
        .map(|rest| rest.split('}').next().unwrap())
        .collect();
    assert_eq!(used, ["SLUICE_VM", "SLUICE_BRIDGE", "SLUICE_CONTROLPLANE"]);
    for name in used {
        let value = settings
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, v)| *v);
        assert!(
            value.is_some_and(|v| !v.is_empty()),
            "{name} is not set: {env}"
        );
    }
    let url = settings
        .iter()
        .find(|(key, _)| *key == "SLUICE_CONTROLPLANE")
        .unwrap()
        .1;
    assert!(url.starts_with("https://"), "{url}");
}

/// The value of `key=` in a unit file.
fn unit_setting(unit: &str, key: &str) -> String {
    unit.lines()
        .find_map(|line| line.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in the unit"))
        .to_string()
}

/// systemd is not PID 1 here, so `systemctl start` cannot run the unit. Its `ExecStart` runs
/// instead under `setpriv` with the unit's `User=`, `Group=`, `CapabilityBoundingSet=` and
/// `NoNewPrivileges=` (the identity and privilege part of its sandbox; the filesystem
/// protections need systemd itself).
fn the_node_runs_as_its_unit_would() {
    let unit = std::fs::read_to_string("/lib/systemd/system/sluice-node.service").unwrap();
    let exec: Vec<String> = unit_setting(&unit, "ExecStart")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(exec[0], "/usr/bin/sluice");
    let capabilities: Vec<String> = unit_setting(&unit, "CapabilityBoundingSet")
        .split_whitespace()
        .map(|cap| format!("+{}", cap.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    assert_eq!(unit_setting(&unit, "NoNewPrivileges"), "yes");
    let node = Command::new("setpriv")
        .arg(format!("--reuid={}", unit_setting(&unit, "User")))
        .arg(format!("--regid={}", unit_setting(&unit, "Group")))
        .args(["--init-groups", "--no-new-privs", "--inh-caps=-all"])
        .arg(format!("--bounding-set=-all,{}", capabilities.join(",")))
        .args(&exec)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let admin: std::net::SocketAddr = "127.0.0.1:9901".parse().unwrap();
    let ready = test_support::wait_until(Duration::from_secs(20), || {
        test_support::http_get(admin, "/readyz").is_ok_and(|answer| answer.status == 200)
    });
    // SAFETY: kill(2) on our own child with a valid signal number has no memory effects.
    unsafe { libc::kill(node.id() as i32, libc::SIGTERM) };
    let output = node.wait_with_output().unwrap();
    assert!(
        ready,
        "the packaged node never became ready: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{output:?}");
}
