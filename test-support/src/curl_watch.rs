//! A watch on the control plane through curl (a client nobody here wrote): its events as they
//! come, one JSON object per line, read on a thread; curl is killed on drop.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use serde_json::Value;

use crate::ControlPlane;

#[derive(Debug)]
pub struct CurlWatch {
    child: Child,
    events: Receiver<Value>,
}

impl CurlWatch {
    /// Starts `curl -N` on `path` (with its `?watch=1...` query) with `token`.
    pub fn start(cp: &ControlPlane, token: &str, path: &str) -> std::io::Result<Self> {
        let mut child = Command::new("curl")
            .args(["-sS", "-N", "--cacert"])
            .arg(cp.ca_file())
            .args(["-H", &format!("Authorization: Bearer {token}")])
            .arg(format!("{}{path}", cp.url()))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("curl without stdout"))?;
        let (sender, events) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(event) = serde_json::from_str::<Value>(&line) else {
                    break;
                };
                if sender.send(event).is_err() {
                    break;
                }
            }
        });
        Ok(Self { child, events })
    }

    /// The next event (`{"type": ..., "object": ...}`), if one comes within `within`.
    pub fn next_event(&self, within: Duration) -> Option<Value> {
        self.events.recv_timeout(within).ok()
    }
}

impl Drop for CurlWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
