//! The container image of `scripts/build-image.sh` (issue 35, finding 5), built from this
//! test's binary and run as a container runtime would run it: the OCI layout is read through
//! its index, manifest and config (every blob checked against its digest), the one layer is
//! unpacked, and the config's `Entrypoint` + `Cmd` run as its `User` in a chroot of that rootfs
//! with new mount, PID and network namespaces (no podman or Docker daemon here). The node must
//! answer `/readyz` on its admin port and stop cleanly on SIGTERM as PID 1.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};
use test_support::{
    http_get, in_netns, is_root, prerequisite, wait_until, HttpResponse, NetNs, SluiceLauncher,
    ROOT_IN_CI,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// A node on the image's default command's config path, its admin endpoint on every address
/// of the pod (as deploy/kubernetes/ binds it for probes and scrapes).
const NODE_CONFIG: &str = "\
listeners:
  admin: {address: 0.0.0.0:9901}
  agent: {address: 0.0.0.0:8150}
  external: {address: 0.0.0.0:8151}
tunnel:
  agents: []
  jwt: {secret_file: /etc/sluice/jwt.secret}
";

/// What the runtime does in the container's new namespaces (`$0` the rootfs, `$1` the image's
/// user, then its entrypoint and command): /proc of the new PID namespace, then the chroot.
const RUNTIME: &str =
    "root=$0 user=$1; shift; mount -t proc proc \"$root/proc\" && exec chroot --userspec=\"$user\" \"$root\" \"$@\"";

/// An OCI image layout on disk, read through its `index.json`.
struct Layout {
    dir: PathBuf,
}

impl Layout {
    /// The blob named by `digest` ("sha256:HEX"), after checking its bytes hash to it.
    fn blob(&self, digest: &str) -> Vec<u8> {
        let hex = digest.strip_prefix("sha256:").unwrap();
        let bytes = std::fs::read(self.dir.join("blobs/sha256").join(hex)).unwrap();
        assert_eq!(
            sha256(&bytes),
            hex,
            "blob {digest} does not match its digest"
        );
        bytes
    }

    fn json(&self, descriptor: &Value) -> Value {
        let bytes = self.blob(descriptor["digest"].as_str().unwrap());
        assert_eq!(descriptor["size"].as_u64(), Some(bytes.len() as u64));
        serde_json::from_slice(&bytes).unwrap()
    }
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap();
    assert!(output.status.success(), "{command:?}: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

/// What the image must hold: the binary, exactly the files `ldd` says it loads, the user
/// database and /tmp.
fn expected_files() -> BTreeSet<String> {
    let mut files: BTreeSet<String> = ["./usr/bin/sluice", "./etc/passwd", "./etc/group"]
        .into_iter()
        .map(String::from)
        .collect();
    for line in run(Command::new("ldd").arg(BIN)).lines() {
        let path = match line.split_once("=> ") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        if let Some(path) = path {
            files.insert(format!(".{path}"));
        }
    }
    files
}

/// The files of a `tar -t` listing (directories end in `/`).
fn listed_files(listing: &str) -> BTreeSet<String> {
    listing
        .lines()
        .filter(|entry| !entry.ends_with('/'))
        .map(String::from)
        .collect()
}

fn the_binary_revision() -> String {
    let version = run(Command::new(BIN).arg("--version"));
    let revision = version.split("(commit ").nth(1).unwrap();
    revision.trim().trim_end_matches(')').to_string()
}

fn build_image(out: &Path) -> Layout {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/build-image.sh");
    let archive = run(Command::new(script)
        .args(["--binary", BIN, "--fast", "--out"])
        .arg(out));
    let archive = PathBuf::from(archive.trim());
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(archive, out.join(format!("sluice-{version}.oci.tar")));
    // The archive is the layout plus Docker's manifest.json, nothing else.
    let in_archive = run(Command::new("tar").arg("-tf").arg(&archive));
    for name in ["./oci-layout", "./index.json", "./manifest.json"] {
        assert!(in_archive.lines().any(|line| line == name), "{in_archive}");
    }
    Layout {
        dir: out.join(format!("sluice-{version}.oci")),
    }
}

/// A container run from the unpacked rootfs as a runtime would: new mount and PID namespaces
/// inside a network namespace of its own, /proc mounted, `argv` run as `user` under chroot.
/// Killed on drop if still running.
struct Container {
    child: std::process::Child,
    log: PathBuf,
    netns: NetNs,
}

impl Container {
    fn start(rootfs: &Path, user: &str, argv: &[String], log: PathBuf) -> Self {
        let netns = NetNs::new("sluice-img").unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", netns.name()])
            .args(["unshare", "--mount", "--pid", "--fork", "--kill-child"])
            .args(["sh", "-c", RUNTIME])
            .arg(rootfs)
            .arg(user)
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self { child, log, netns }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The host PID of the container's PID 1: the only child of `unshare --fork`.
    /// None until it has forked, or once it has exited.
    fn init(&self) -> Option<i32> {
        let unshare = self.child.id();
        let children =
            std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    }

    /// Runs `argv` inside as `kubectl exec` does: the container's namespaces, root and user.
    fn exec(&self, user: &str, argv: &[&str]) -> Option<std::process::Output> {
        let (uid, gid) = user.split_once(':').unwrap();
        let output = Command::new("nsenter")
            .arg(format!("--target={}", self.init()?))
            .args(["--mount", "--pid", "--net", "--root", "--wd"])
            .args([format!("--setuid={uid}"), format!("--setgid={gid}")])
            .args(argv)
            .output()
            .unwrap();
        Some(output)
    }

    /// `GET path` on the admin port 9901 inside.
    fn http(&self, path: &'static str) -> Option<HttpResponse> {
        in_netns(self.netns.name(), move || {
            http_get("127.0.0.1:9901".parse().unwrap(), path)
        })
        .ok()?
        .ok()
    }

    /// SIGTERM to PID 1, as the kubelet stops a pod; asserts a clean exit (0) within 15 s.
    fn stop_cleanly(mut self) {
        // SAFETY: kill(2) with the PID of our own child's only child.
        assert_eq!(
            unsafe { libc::kill(self.init().unwrap(), libc::SIGTERM) },
            0
        );
        let stopped = wait_until(Duration::from_secs(15), || {
            self.child.try_wait().unwrap().is_some()
        });
        assert!(stopped, "no stop on SIGTERM:\n{}", self.log());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status:?}\n{}", self.log());
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The control plane's container args as `deploy/kubernetes/controlplane.yaml` gives them.
fn controlplane_args() -> Vec<String> {
    let manifest = test_support::workspace_root().join("deploy/kubernetes/controlplane.yaml");
    let dump = run(Command::new(test_support::python())
        .arg(test_support::python_script("validate_manifests.py"))
        .arg("--dump")
        .arg(manifest));
    let objects: Value = serde_json::from_str(&dump).unwrap();
    let set = objects
        .as_array()
        .unwrap()
        .iter()
        .find(|object| object["kind"] == "StatefulSet")
        .unwrap();
    let args = &set["spec"]["template"]["spec"]["containers"][0]["args"];
    args.as_array()
        .unwrap()
        .iter()
        .map(|arg| arg.as_str().unwrap().to_string())
        .collect()
}

/// The Secret's PKI, made as docs/OPERATIONS.md says (a first start of `sluice controlplane`
/// with the Service's name), and the volume, where the StatefulSet mounts them; the volume
/// owned by the image's user (as `fsGroup` makes it).
fn controlplane_mounts(rootfs: &Path, user: &str) {
    let generator = SluiceLauncher::new(BIN).unwrap();
    let data_dir = generator.dir().join("pki-gen");
    let mut generated = generator
        .args(["controlplane", "--listen", "127.0.0.1:0"])
        .args(["--hostname", "sluice-controlplane.sluice.svc", "--data-dir"])
        .arg(&data_dir)
        .spawn()
        .unwrap();
    generated.signal(libc::SIGTERM);
    assert!(generated.wait_exit(Duration::from_secs(15)).is_some());
    let pki = rootfs.join("etc/sluice/pki");
    std::fs::create_dir_all(&pki).unwrap();
    for file in ["ca.crt", "server.crt", "server.key"] {
        std::fs::copy(data_dir.join("pki").join(file), pki.join(file)).unwrap();
    }
    run(Command::new("chmod").arg("-R").arg("a+rX").arg(&pki));
    let store = rootfs.join("var/lib/sluice/controlplane");
    std::fs::create_dir_all(&store).unwrap();
    run(Command::new("chown").arg(user).arg(&store));
}

#[test]
fn the_image_builds_offline_and_runs_a_node_and_a_control_plane() {
    if !prerequisite(
        "root (chroot and namespaces run the image)",
        is_root(),
        ROOT_IN_CI,
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let layout = build_image(dir.path());
    let oci_layout = std::fs::read_to_string(layout.dir.join("oci-layout")).unwrap();
    assert!(oci_layout.contains("\"imageLayoutVersion\":\"1.0.0\""));
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.dir.join("index.json")).unwrap()).unwrap();
    let descriptor = &index["manifests"][0];
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        descriptor["annotations"]["io.containerd.image.name"],
        format!("docker.io/library/sluice:{version}")
    );
    let manifest = layout.json(descriptor);
    let config = layout.json(&manifest["config"]);
    let labels = &config["config"]["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], version);
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        the_binary_revision()
    );
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    let layer_path = dir.path().join("layer.tar.gz");
    std::fs::write(
        &layer_path,
        layout.blob(layers[0]["digest"].as_str().unwrap()),
    )
    .unwrap();
    let tar = Command::new("gzip")
        .arg("-dc")
        .arg(&layer_path)
        .output()
        .unwrap();
    assert_eq!(
        config["rootfs"]["diff_ids"][0],
        format!("sha256:{}", sha256(&tar.stdout))
    );
    let listing = run(Command::new("tar").arg("-tzf").arg(&layer_path));
    assert_eq!(listed_files(&listing), expected_files());
    assert!(listing.lines().any(|entry| entry == "./tmp/"), "{listing}");

    // Unpacked as a runtime would, with what a runtime and Kubernetes add: /proc, and the
    // config file (a ConfigMap) and secret at the image's default command's paths.
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("proc")).unwrap();
    std::fs::create_dir_all(rootfs.join("etc/sluice")).unwrap();
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&layer_path)
        .arg("-C")
        .arg(&rootfs));
    std::fs::write(rootfs.join("etc/sluice/node.yaml"), NODE_CONFIG).unwrap();
    std::fs::write(
        rootfs.join("etc/sluice/jwt.secret"),
        "an image test's secret of at least 32 bytes\n",
    )
    .unwrap();
    let user = config["config"]["User"].as_str().unwrap();
    let uid = user.split(':').next().unwrap();
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(
        passwd.contains(&format!("sluice:x:{uid}:{uid}:")),
        "{passwd}"
    );
    assert_ne!(uid, "0", "the image runs as root");

    let argv: Vec<String> = [&config["config"]["Entrypoint"], &config["config"]["Cmd"]]
        .into_iter()
        .flat_map(|part| part.as_array().unwrap().clone())
        .map(|arg| arg.as_str().unwrap().to_string())
        .collect();
    let node = Container::start(&rootfs, user, &argv, dir.path().join("node.log"));
    let ready = wait_until(Duration::from_secs(20), || {
        node.http("/readyz")
            .is_some_and(|response| response.status == 200)
    });
    assert!(
        ready,
        "the node in the image never became ready:\n{}",
        node.log()
    );
    let metrics = node.http("/metrics").unwrap();
    // The image's label, not the binary's `--version` again: what runs is the image's copy.
    let revision = format!("revision={}", labels["org.opencontainers.image.revision"]);
    assert!(metrics.body.contains(&revision), "{}", metrics.body);
    node.stop_cleanly();

    // The control plane with its StatefulSet's args; `kubectl exec` of `sluice status` and of
    // `token create` (what docs/OPERATIONS.md has an operator run) work inside.
    controlplane_mounts(&rootfs, user);
    let mut argv = vec!["/usr/bin/sluice".to_string()];
    argv.extend(controlplane_args());
    let log = dir.path().join("controlplane.log");
    let controlplane = Container::start(&rootfs, user, &argv, log);
    let status = [
        "/usr/bin/sluice",
        "status",
        "--admin",
        "127.0.0.1:6443",
        "--ca",
        "/etc/sluice/pki/ca.crt",
    ];
    let ready = wait_until(Duration::from_secs(20), || {
        controlplane
            .exec(user, &status)
            .is_some_and(|output| output.status.success())
    });
    assert!(
        ready,
        "{:?}\n{}",
        controlplane.exec(user, &status),
        controlplane.log()
    );
    let token = controlplane
        .exec(
            user,
            &[
                "/usr/bin/sluice",
                "controlplane",
                "token",
                "create",
                "--role",
                "node",
                "--subject",
                "sluice-node",
                "--data-dir",
                "/var/lib/sluice/controlplane",
            ],
        )
        .unwrap();
    assert!(token.status.success(), "{token:?}\n{}", controlplane.log());
    assert!(!String::from_utf8_lossy(&token.stdout).trim().is_empty());
    controlplane.stop_cleanly();
}
