//! The processes that block a unit's proof, listed for `status` from the unit's cgroup
//! subtree and `/proc/PID/stat` (the listing the leftover count uses).

use std::path::Path;

use super::core::{MAX_REMAINING, RemainingProcess, UnitStatus};
use crate::cgroup::procs::list_processes;

/// Fills in the processes of a blocked unit's cgroup (nothing for one that is not blocked).
pub(super) fn add_remaining(cgroup_root: &Path, status: &mut UnitStatus) {
    let (true, Some(cgroup)) = (status.blocked, status.cgroup.as_deref()) else {
        return;
    };
    match list_processes(cgroup_root, cgroup) {
        Ok(census) => {
            let processes = census.processes;
            status.remaining_total = Some(processes.len());
            let listed = processes.into_iter().take(MAX_REMAINING).map(|p| {
                let below = p.cgroup.to_string_lossy();
                RemainingProcess {
                    pid: p.pid,
                    comm: String::from_utf8_lossy(&p.comm).into_owned(),
                    state: p.state.to_string(),
                    cgroup: if below.is_empty() {
                        cgroup.to_owned()
                    } else {
                        format!("{cgroup}/{below}")
                    },
                }
            });
            status.remaining = Some(listed.collect());
        }
        Err(e) => status.remaining_error = Some(e.to_string()),
    }
}
