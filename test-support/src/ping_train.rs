//! A ping train from a network namespace, measured the way a neighbour feels an interruption:
//! not only how many echoes went unanswered, but the longest time between two consecutive
//! replies. A neighbour that holds its packets while it resolves the target again loses none
//! of them (they leave late, all at once) yet gets nothing back for as long as it waits, so the
//! lost count alone hides exactly the stall that matters.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `ping -D -i <interval>` running inside a namespace; [`PingTrain::stop`] ends and measures it.
#[derive(Debug)]
pub struct PingTrain {
    child: Option<Child>,
    /// Reads ping's output as it comes: a pipe left full would stall ping itself.
    reader: Option<JoinHandle<String>>,
    /// Replies read so far (not duplicates): what a test waits on to know the train is running.
    replies: Arc<AtomicU64>,
    /// When the train started, in `ping -D`'s clock (seconds since the epoch).
    started: f64,
}

/// What a stopped ping train saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingReport {
    pub sent: u64,
    pub received: u64,
    pub duplicates: u64,
    /// The longest time without a reply: between two consecutive replies (by their arrival,
    /// `ping -D`), from the start to the first and from the last to the stop. A peer that stops
    /// getting replies shows it even if the train ends before they resume.
    pub longest_gap: Duration,
}

impl PingReport {
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.received)
    }
}

impl std::fmt::Display for PingReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} lost, {} duplicated, longest gap between replies {:?}",
            self.lost(),
            self.sent,
            self.duplicates,
            self.longest_gap
        )
    }
}

impl PingTrain {
    /// Starts pinging `target` from namespace `netns` every `interval` (below 2 ms needs root,
    /// which these tests are).
    pub fn start(netns: &str, target: &str, interval: Duration) -> std::io::Result<Self> {
        let interval = format!("{:.3}", interval.as_secs_f64());
        let mut child = Command::new("ip")
            .args(["netns", "exec", netns, "ping", "-n", "-D", "-i", &interval])
            .arg(target)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped stdout");
        let replies = Arc::new(AtomicU64::new(0));
        let counted = replies.clone();
        let reader = std::thread::spawn(move || {
            let mut stdout = BufReader::new(stdout);
            let mut output = String::new();
            loop {
                let start = output.len();
                match stdout.read_line(&mut output) {
                    Ok(0) | Err(_) => break,
                    Ok(_) if reply_time(&output[start..]).is_some() => {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                }
            }
            output
        });
        Ok(PingTrain {
            child: Some(child),
            reader: Some(reader),
            replies,
            started: now(),
        })
    }

    /// Replies so far, duplicates not counted.
    pub fn replies(&self) -> u64 {
        self.replies.load(Ordering::Relaxed)
    }

    /// Waits up to `timeout` for `count` more replies; whether they came.
    pub fn wait_replies(&self, count: u64, timeout: Duration) -> bool {
        let target = self.replies() + count;
        crate::wait_until(timeout, || self.replies() >= target)
    }

    /// Stops the train (SIGINT: ping prints its summary) and measures it.
    pub fn stop(mut self) -> PingReport {
        let mut child = self.child.take().expect("running");
        let stopped = now();
        let pid = i32::try_from(child.id()).expect("pid");
        // SAFETY: kill(2) on our own child, not yet reaped. `ip netns exec` execs ping, so the
        // child is ping itself.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let _ = child.wait();
        let output = self.reader.take().expect("reader").join().expect("reader");
        parse(&output, self.started, stopped)
            .unwrap_or_else(|| panic!("no ping summary in {output}"))
    }
}

impl Drop for PingTrain {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn now() -> f64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.expect("a clock after 1970").as_secs_f64()
}

/// The arrival time in seconds of a reply line: `[1732832000.123456] 64 bytes from ...`.
fn reply_time(line: &str) -> Option<f64> {
    if !line.contains(" bytes from ") || line.contains("DUP!") {
        return None;
    }
    let stamp = line.strip_prefix('[')?.split(']').next()?;
    stamp.parse().ok()
}

/// The report of `ping -D` output of a train run from `started` to `stopped` (epoch seconds);
/// `None` without its summary line.
fn parse(output: &str, started: f64, stopped: f64) -> Option<PingReport> {
    let summary = output
        .lines()
        .find(|line| line.contains("packets transmitted"))?;
    let numbers: Vec<u64> = summary
        .split(',')
        .filter_map(|part| part.split_whitespace().next()?.parse().ok())
        .collect();
    let mut times = vec![started];
    times.extend(output.lines().filter_map(reply_time));
    times.push(stopped);
    let longest = times
        .windows(2)
        .map(|pair| pair[1] - pair[0])
        .fold(0.0, f64::max);
    Some(PingReport {
        sent: *numbers.first()?,
        received: *numbers.get(1)?,
        duplicates: output.lines().filter(|l| l.contains("DUP!")).count() as u64,
        longest_gap: Duration::from_secs_f64(longest.max(0.0)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_gap_is_between_consecutive_replies_and_duplicates_do_not_close_it() {
        let output = "\
PING 10.0.0.2 (10.0.0.2) 56(84) bytes of data.
[1000.000000] 64 bytes from 10.0.0.2: icmp_seq=1 ttl=64 time=0.050 ms
[1000.010000] 64 bytes from 10.0.0.2: icmp_seq=2 ttl=64 time=0.050 ms
[1000.500000] 64 bytes from 10.0.0.2: icmp_seq=2 ttl=64 time=0.050 ms (DUP!)
[1001.040000] 64 bytes from 10.0.0.2: icmp_seq=3 ttl=64 time=1030 ms
[1001.041000] 64 bytes from 10.0.0.2: icmp_seq=4 ttl=64 time=1020 ms

--- 10.0.0.2 ping statistics ---
5 packets transmitted, 4 received, +1 duplicates, 20% packet loss, time 1041ms
";
        let report = parse(output, 999.99, 1001.2).unwrap();
        assert_eq!((report.sent, report.received, report.lost()), (5, 4, 1));
        assert_eq!(report.duplicates, 1);
        let gap = report.longest_gap.as_secs_f64();
        assert!((gap - 1.03).abs() < 1e-6, "{gap}");
        // Replies that stop before the train does: the gap runs to the stop.
        let report = parse(output, 999.99, 1002.5).unwrap();
        let gap = report.longest_gap.as_secs_f64();
        assert!((gap - 1.459).abs() < 1e-6, "{gap}");
        // And from the start to a first reply that came late.
        let report = parse(output, 998.0, 1001.2).unwrap();
        assert_eq!(report.longest_gap, Duration::from_secs(2));
    }

    #[test]
    fn a_train_without_its_summary_is_no_report() {
        let output = "[1.0] 64 bytes from 10.0.0.2: icmp_seq=1";
        assert_eq!(parse(output, 0.0, 2.0), None);
    }
}
