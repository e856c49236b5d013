//! `sluice controlplane` as a real process with its data directory, and kubectl pointed at it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::{wait_until, SluiceLauncher, SluiceProcess};

/// A running control plane. Its data directory outlives the process, so a test can stop it
/// and start it again on the same store and address.
#[derive(Debug)]
pub struct ControlPlane {
    binary: PathBuf,
    data: tempfile::TempDir,
    extra_args: Vec<String>,
    running: bool,
    /// Started by [`ControlPlane::start_replica`]: writes no kubeconfig of its own.
    replica: bool,
    pub process: SluiceProcess,
    pub address: SocketAddr,
}

impl ControlPlane {
    /// Starts `sluice controlplane` on a free loopback port with a new data directory.
    pub fn start(binary: &str, extra_args: &[&str]) -> std::io::Result<Self> {
        Self::start_new(binary, "127.0.0.1:0", extra_args, false)
    }

    /// Starts `sluice controlplane` listening on `listen` (e.g. `10.1.2.1:0`, an address other
    /// namespaces reach; give `--hostname` for it in `extra_args` so the serving certificate
    /// names it).
    pub fn start_on(binary: &str, listen: &str, extra_args: &[&str]) -> std::io::Result<Self> {
        Self::start_new(binary, listen, extra_args, false)
    }

    /// Starts another replica of a control plane whose store (etcd) already holds the admin
    /// token: it issues none and writes no `admin.kubeconfig` (use the first replica's with
    /// [`ControlPlane::kubectl_via`]). Pass `--pki-dir` of the first in `extra_args` so that
    /// both serve the same certificate.
    pub fn start_replica(binary: &str, extra_args: &[&str]) -> std::io::Result<Self> {
        Self::start_new(binary, "127.0.0.1:0", extra_args, true)
    }

    fn start_new(
        binary: &str,
        listen: &str,
        extra_args: &[&str],
        replica: bool,
    ) -> std::io::Result<Self> {
        let data = tempfile::tempdir()?;
        let extra_args: Vec<String> = extra_args.iter().map(|arg| arg.to_string()).collect();
        let process = launch(
            Path::new(binary),
            data.path(),
            listen,
            &extra_args,
            !replica,
        )?;
        let address = process.address("controlplane");
        Ok(Self {
            binary: PathBuf::from(binary),
            data,
            extra_args,
            running: true,
            replica,
            process,
            address,
        })
    }

    /// The generated CA and serving certificate (`<data-dir>/pki`), for `--pki-dir` of
    /// another replica.
    pub fn pki_dir(&self) -> PathBuf {
        self.data.path().join("pki")
    }

    /// Runs kubectl with `kubeconfig` against this control plane (`--server` of this one).
    pub fn kubectl_via(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        let server = self.url();
        let mut all = vec!["--server", server.as_str()];
        all.extend_from_slice(args);
        kubectl_with(kubeconfig, &all, stdin)
    }

    /// Stops the process (SIGTERM) and waits for it.
    pub fn stop(&mut self) {
        if std::mem::replace(&mut self.running, false) {
            self.process.signal(libc::SIGTERM);
            let _ = self.process.wait_exit(Duration::from_secs(20));
        }
    }

    /// Kills the process (SIGKILL: no drain, no goodbye to its watchers, as a crash or an OOM
    /// kill would end it) and reaps it.
    pub fn kill(&mut self) {
        if std::mem::replace(&mut self.running, false) {
            self.process.signal(libc::SIGKILL);
            let status = self.process.wait_exit(Duration::from_secs(20));
            assert!(status.is_some(), "the control plane outlived SIGKILL");
        }
    }

    /// Starts it again on the same data directory and address (stopping it first if it runs).
    pub fn restart(&mut self) -> std::io::Result<()> {
        self.stop();
        let listen = self.address.to_string();
        let mut last = None;
        // The port was just released; another process could take it, so retry a little.
        for _ in 0..20 {
            match launch(
                &self.binary,
                self.data.path(),
                &listen,
                &self.extra_args,
                !self.replica,
            ) {
                Ok(process) => {
                    self.process = process;
                    self.running = true;
                    return Ok(());
                }
                Err(error) => last = Some(error),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("restart failed")))
    }

    pub fn data_dir(&self) -> &Path {
        self.data.path()
    }

    /// The admin kubeconfig the control plane wrote on its first start.
    pub fn kubeconfig(&self) -> PathBuf {
        self.data.path().join("admin.kubeconfig")
    }

    /// The CA the serving certificate chains to.
    pub fn ca_file(&self) -> PathBuf {
        self.data.path().join("pki/ca.crt")
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// Runs kubectl as the admin; `stdin` is fed to it when given.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        kubectl_with(&self.kubeconfig(), args, stdin)
    }

    /// Issues a token with `sluice controlplane token create` and returns it.
    pub fn token(&self, role: &str, subject: &str) -> String {
        let output = Command::new(&self.binary)
            .args([
                "controlplane",
                "token",
                "create",
                "--role",
                role,
                "--subject",
                subject,
            ])
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .output()
            .expect("run sluice controlplane token create");
        assert!(
            output.status.success(),
            "token create failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// The admin's bearer token, from the kubeconfig.
    pub fn admin_token(&self) -> String {
        let text = std::fs::read_to_string(self.kubeconfig()).expect("read admin kubeconfig");
        let document: serde_json::Value = serde_json::from_str(&text).expect("JSON kubeconfig");
        document["users"][0]["user"]["token"]
            .as_str()
            .expect("a token user")
            .to_string()
    }

    /// curl against the API as the admin: `(HTTP status, body)`.
    pub fn curl(&self, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        self.curl_as(method, path, "application/json", body)
    }

    /// [`ControlPlane::curl`] with the body's content type (a merge patch, say).
    pub fn curl_as(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: Option<&str>,
    ) -> (u16, String) {
        let mut command = Command::new("curl");
        command
            .args(["--silent", "--max-time", "10", "--request", method])
            .arg("--cacert")
            .arg(self.ca_file())
            .args([
                "--header",
                &format!("Authorization: Bearer {}", self.admin_token()),
            ])
            .args(["--header", &format!("Content-Type: {content_type}")])
            .args(["--write-out", "\n%{http_code}"]);
        if let Some(body) = body {
            command.args(["--data-binary", body]);
        }
        let output = command
            .arg(format!("{}{path}", self.url()))
            .output()
            .expect("curl is installed");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    /// Makes `vm` an Agented VirtualMachine whose agent has reported (a runtime info written
    /// with a vm-agent token for it), and waits until the VMManager has it AgentedConnected, so
    /// its agent receives its policy span. Returns that vm-agent token.
    pub fn connect_vm(&self, vm: &str) -> String {
        let object = serde_json::json!({"apiVersion": "vm.sluice.dev/v1alpha1",
            "kind": "VirtualMachine", "metadata": {"name": vm},
            "spec": {"management": "Agented", "uplink": {"name": "eth0"}}});
        let (code, body) = self.curl(
            "POST",
            "/apis/vm.sluice.dev/v1alpha1/virtualmachines",
            Some(&object.to_string()),
        );
        assert!(
            code == 201 || code == 409,
            "creating VM {vm}: {code} {body}"
        );
        let token = self.token("vm-agent", vm);
        let report = serde_json::json!({"apiVersion": "vm.sluice.dev/v1alpha1",
            "kind": "VirtualMachineRuntimeInfo", "metadata": {"name": vm},
            "agentState": "Active", "agentVersion": "test"});
        let output = Command::new("curl")
            .args(["--silent", "--max-time", "10", "--request", "POST"])
            .arg("--cacert")
            .arg(self.ca_file())
            .args(["--header", &format!("Authorization: Bearer {token}")])
            .args(["--header", "Content-Type: application/json"])
            .args(["--data-binary", &report.to_string()])
            .args(["--write-out", "\n%{http_code}"])
            .arg(format!(
                "{}/apis/vm.sluice.dev/v1alpha1/virtualmachineruntimeinfos",
                self.url()
            ))
            .output()
            .expect("curl is installed");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            text.ends_with("201") || text.ends_with("409"),
            "reporting for {vm}: {text}"
        );
        let path = format!("/apis/vm.sluice.dev/v1alpha1/virtualmachines/{vm}");
        let connected = wait_until(Duration::from_secs(10), || {
            let (_, body) = self.curl("GET", &path, None);
            body.contains("\"state\":\"AgentedConnected\"")
        });
        assert!(connected, "VM {vm} did not become AgentedConnected");
        token
    }

    /// A kubeconfig for `token` next to the admin's.
    pub fn kubeconfig_for(&self, name: &str, token: &str) -> PathBuf {
        let admin = std::fs::read_to_string(self.kubeconfig()).expect("read admin kubeconfig");
        let mut document: serde_json::Value =
            serde_json::from_str(&admin).expect("the admin kubeconfig is JSON");
        document["users"][0]["user"]["token"] = serde_json::json!(token);
        let path = self.data.path().join(format!("{name}.kubeconfig"));
        std::fs::write(&path, document.to_string()).expect("write kubeconfig");
        path
    }
}

/// Runs kubectl with `kubeconfig`.
pub fn kubectl_with(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut command = Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout", "20s"])
        .args(args)
        .env("KUBECACHEDIR", kubeconfig.with_extension("cache"))
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command
        .spawn()
        .expect("kubectl is installed (scripts/test.sh installs it)");
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        std::io::Write::write_all(&mut pipe, text.as_bytes()).expect("write kubectl stdin");
    }
    child.wait_with_output().expect("kubectl ran")
}

fn launch(
    binary: &Path,
    data: &Path,
    listen: &str,
    extra: &[String],
    wait_kubeconfig: bool,
) -> std::io::Result<SluiceProcess> {
    let process = SluiceLauncher::new(binary)?
        .args(["controlplane", "--listen", listen, "--data-dir"])
        .arg(data)
        .args(extra)
        .spawn()?;
    if wait_kubeconfig {
        let kubeconfig = data.join("admin.kubeconfig");
        wait_until(Duration::from_secs(10), || kubeconfig.exists());
    }
    Ok(process)
}
