//! The default thread count: one rule, [`threads_for`], over what [`Cpus::read`] finds of the machine.
//! Every context and embedder asked for 0 threads, a restore that keeps a checkpoint's count, the server's
//! slots and the Ray workers take their count from [`default_threads`] (docs/threads.md).
//!
//! The rule: the physical cores among the CPUs this process may run on, at most its CPU quota, shared out
//! between the slots of the process that decode at once (at least 1 each). Hyper-threads are not counted: two
//! threads of one core share its vector units, and ggml's threads wait for each other at every operation of a
//! graph, so the slower of two siblings sets the pace. A thread count past what the process can get is what
//! made decoding collapse when another process wanted a core (issue 33); ggml's waits no longer spin through
//! a descheduled partner's time slice (patch 0005), and the rule never asks for more than the machine has.

use std::collections::BTreeSet;

use crate::limits::MAX_THREADS;

/// What the rule reads of the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpus {
    /// The CPUs this process may use: its affinity mask, capped by its cgroup CPU quota (rounded down, at
    /// least 1), as `std::thread::available_parallelism` reads them.
    pub usable: u32,
    /// The physical cores among the CPUs of the affinity mask (hyper-threads of one core counted once); 0
    /// where the topology cannot be read (outside Linux, or without `/sys`).
    pub physical_cores: u32,
}

impl Cpus {
    /// This process's CPUs, read now (the affinity mask can change while a process runs).
    pub fn read() -> Self {
        let usable = std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX));
        Self {
            usable,
            physical_cores: physical_cores().unwrap_or(0),
        }
    }
}

/// The rule: threads for each of `slots` generations decoding at once in one process on `cpus`.
///
/// The physical cores (the usable CPUs where the cores are unknown), at most the usable CPUs, divided
/// between the slots (rounded down), at least 1 and at most [`MAX_THREADS`].
pub fn threads_for(cpus: Cpus, slots: u32) -> u32 {
    let usable = cpus.usable.max(1);
    let cores = match cpus.physical_cores {
        0 => usable,
        cores => cores.min(usable),
    };
    (cores / slots.max(1)).clamp(1, MAX_THREADS.unsigned_abs())
}

/// The default thread count of each of `slots` generations decoding at once in this process: the rule over
/// this machine, read now.
pub fn default_threads(slots: u32) -> i32 {
    i32::try_from(threads_for(Cpus::read(), slots)).unwrap_or(1)
}

/// The physical cores among the CPUs this thread may run on: the distinct sets of hardware threads that share
/// a core (`topology/core_cpus_list`, or `thread_siblings_list` on older kernels), or `None` if unreadable.
fn physical_cores() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/thread-self/status")
        .or_else(|_| std::fs::read_to_string("/proc/self/status"))
        .ok()?;
    let allowed = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))?;
    let mut cores = BTreeSet::new();
    for cpu in cpu_list(allowed.trim())? {
        let topology = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
        let siblings = std::fs::read_to_string(format!("{topology}/core_cpus_list"))
            .or_else(|_| std::fs::read_to_string(format!("{topology}/thread_siblings_list")))
            .ok()?;
        cores.insert(siblings.trim().to_owned());
    }
    u32::try_from(cores.len()).ok().filter(|&n| n > 0)
}

/// The CPUs of a kernel CPU list (`0-3,8,10-11`), or `None` if it is not one; at most 65,536 of them.
pub(crate) fn cpu_list(text: &str) -> Option<Vec<u32>> {
    const MOST: u32 = 1 << 16;
    let mut cpus = Vec::new();
    for part in text.split(',').filter(|part| !part.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let cpu = part.parse::<u32>().ok()?;
                (cpu, cpu)
            }
        };
        if first > last || last >= MOST || cpus.len() + (last - first) as usize >= MOST as usize {
            return None;
        }
        cpus.extend(first..=last);
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(usable: u32, physical_cores: u32) -> Cpus {
        Cpus {
            usable,
            physical_cores,
        }
    }

    #[test]
    fn the_rule_counts_cores_within_the_quota_and_shares_them_out() {
        assert_eq!(threads_for(cpus(2, 2), 1), 2); // this workplace's 2-core machine
        assert_eq!(threads_for(cpus(8, 4), 1), 4); // 4 cores with hyper-threads
        assert_eq!(threads_for(cpus(2, 4), 1), 2); // a quota of 2 CPUs on 4 cores
        assert_eq!(threads_for(cpus(6, 0), 1), 6); // cores unknown: the usable CPUs
        assert_eq!(threads_for(cpus(16, 8), 2), 4); // two slots
        assert_eq!(threads_for(cpus(16, 8), 3), 2); // rounded down
        assert_eq!(threads_for(cpus(2, 2), 4), 1); // at least one each
        assert_eq!(threads_for(cpus(0, 0), 0), 1);
        assert_eq!(threads_for(cpus(4096, 2048), 1), 512); // ggml's limit
    }

    #[test]
    fn this_machine_gets_at_least_one_thread_and_no_more_than_it_has() {
        let machine = Cpus::read();
        let threads = default_threads(1);
        assert!(threads >= 1);
        assert!(threads.unsigned_abs() <= machine.usable.max(1));
        assert!(default_threads(u32::MAX) == 1);
    }

    #[test]
    fn kernel_cpu_lists_are_read() {
        assert_eq!(cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(cpu_list("5"), Some(vec![5]));
        assert_eq!(cpu_list(""), Some(vec![]));
        assert_eq!(cpu_list("3-1"), None);
        assert_eq!(cpu_list("a"), None);
        assert_eq!(cpu_list("0-4294967295"), None);
    }
}
