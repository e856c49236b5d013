use std::fs::File;
use std::os::fd::AsRawFd;

/// Runs `body` on a new thread that has first entered the network namespace `netns` (made by
/// `ip netns add`, so `/run/netns/<netns>` names it), and returns what it returns.
///
/// For code that acts on "the current network namespace" (netlink, `ioctl`s, sockets): setns(2)
/// moves only the calling thread, and a socket belongs to the namespace its creating thread was
/// in. So `body` should build its own current-thread tokio runtime there if it needs one: a
/// multi-thread runtime's workers would still live in the test's own namespace.
pub fn in_netns<T, F>(netns: &str, body: F) -> std::io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let file = File::open(format!("/run/netns/{netns}"))?;
    std::thread::spawn(move || {
        // SAFETY: setns(2) on an open namespace file; it changes only this new thread.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        drop(file);
        Ok(body())
    })
    .join()
    .map_err(|_| std::io::Error::other(format!("the thread in {netns} panicked")))?
}
