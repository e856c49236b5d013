//! The machine a run happened on, for the summary (absolute numbers drift between machines).

use std::process::Command;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub tools: Vec<String>,
}

fn first_line_of(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    let text = if output.stdout.is_empty() {
        output.stderr
    } else {
        output.stdout
    };
    String::from_utf8_lossy(&text)
        .lines()
        .next()
        .map(|line| line.trim().to_string())
}

pub fn describe() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map_or_else(
            || "unknown".to_string(),
            |(_, model)| model.trim().to_string(),
        );
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_string(), |text| text.trim().to_string());
    let tools = [("h2load", "--version"), ("haproxy", "-v"), ("nginx", "-v")]
        .iter()
        .filter_map(|(program, flag)| first_line_of(program, &[flag]))
        .collect();
    Machine {
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model,
        kernel,
        tools,
    }
}

impl Machine {
    /// One line for a summary; `driver` is Sluice's I/O driver where a Sluice process ran.
    pub fn markdown(&self, driver: Option<&str>) -> String {
        let driver = driver.map_or_else(String::new, |d| format!("; Sluice I/O driver: {d}"));
        format!(
            "Machine: {} CPU(s), {}, Linux {}{driver}; {}.\n",
            self.cpus,
            self.cpu_model,
            self.kernel,
            self.tools.join(", ")
        )
    }
}
