//! Where the client and the server may run: pinned to one CPU (`taskset -c 0`) or not

/// `Cpus_allowed_list` of process `pid` (`self` for this one), e.g. "0" or "0-1".
fn allowed_cpus(pid: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|cpus| cpus.trim().to_owned())
        })
        .unwrap_or_else(|| "?".to_owned())
}

/// The CPUs the client and a server may use. A redis-server started by this program inherits
/// the program's affinity, so `taskset -c 0 cargo bench ...` pins both to CPU 0.
pub(crate) struct Placement {
    client: String,
    server: String,
}

impl Placement {
    pub(crate) fn of(server_pid: u32) -> Placement {
        Placement {
            client: allowed_cpus("self"),
            server: allowed_cpus(&server_pid.to_string()),
        }
    }

    /// Client and server share exactly one CPU.
    pub(crate) fn pinned(&self) -> bool {
        let single = !self.client.contains([',', '-']);
        single && self.client == self.server
    }

    /// "pinned to CPU 0" or "unpinned".
    pub(crate) fn short(&self) -> String {
        if self.pinned() {
            format!("pinned to CPU {}", self.client)
        } else {
            "unpinned".to_owned()
        }
    }

    /// For the table's header.
    pub(crate) fn describe(&self) -> String {
        format!(
            "{}: client CPUs {}, server CPUs {}",
            self.short(),
            self.client,
            self.server
        )
    }
}
