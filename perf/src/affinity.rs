//! CPU lists (`taskset` syntax) and pinning the calling thread to one: how scenarios that run
//! work inside the harness process (watchers, a UDP reader) keep it off the measured cores.

use anyhow::bail;

/// `1`, `0-1`, `0,2-3` into CPU numbers, each below `CPU_SETSIZE`.
pub fn parse_cpus(list: &str) -> anyhow::Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<usize>()?, b.trim().parse::<usize>()?),
            None => (part.trim().parse::<usize>()?, part.trim().parse::<usize>()?),
        };
        cpus.extend(first..=last);
    }
    if cpus.is_empty() || cpus.iter().any(|&cpu| cpu >= libc::CPU_SETSIZE as usize) {
        bail!("bad CPU list {list:?}");
    }
    Ok(cpus)
}

/// Pins the calling thread (and the threads it starts afterwards) to `cpus`.
pub fn pin_this_thread(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it (every CPU
    // number was checked against CPU_SETSIZE by `parse_cpus`).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: see above.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: sched_setaffinity on the calling thread (pid 0) with a valid set.
    let result = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpus("1").unwrap(), vec![1]);
        assert_eq!(parse_cpus("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        assert!(parse_cpus("x").is_err());
        assert!(parse_cpus("100000").is_err());
    }
}
