//! Who listens on a port: the program the lab started, or somebody else.
//!
//! The lab gives a program a free port ([`crate::process::free_port`]) and then waits for it to
//! answer there. A free port is free only when it is picked: another program (another `lab`,
//! a test running beside it) may bind it before the guest does. The guest then fails to bind
//! and exits, and an answer on that port is the *other* program's. Judging a learner's code by
//! a stranger's answers is the worst mistake the lab can make, so an answer counts only once
//! the kernel says that the listening socket belongs to the program the lab started.
//!
//! The kernel says it in `/proc`: `/proc/net/tcp` (and `tcp6`) lists each listening socket with
//! its inode, and `/proc/PID/fd` shows which process holds which socket. Both are read with the
//! `procfs` crate.

use std::collections::{HashMap, HashSet};

use procfs::net::TcpState;
use procfs::process::FDTarget;

/// Who holds the listening socket of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortHolder {
    /// Nobody listens on it (yet).
    Nobody,
    /// The program the lab started: its process group, or a process it started.
    Program,
    /// Another program (or one whose files this user may not read).
    Other,
}

/// Who listens on TCP `port`, at any local address (IPv4 or IPv6), as seen from the program
/// whose process group leader is `leader`: a process of that group, or any descendant of the
/// leader (a child that left the group, a pool started with `setsid`), counts as the program.
pub fn port_holder(port: u16, leader: u32) -> PortHolder {
    let listening: HashSet<u64> = [procfs::net::tcp(), procfs::net::tcp6()]
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.state == TcpState::Listen && entry.local_address.port() == port)
        .map(|entry| entry.inode)
        .collect();
    if listening.is_empty() {
        return PortHolder::Nobody;
    }
    let holds_one = |pid: i32| {
        procfs::process::Process::new(pid)
            .and_then(|process| process.fd())
            .is_ok_and(|fds| {
                fds.flatten().any(
                    |fd| matches!(fd.target, FDTarget::Socket(inode) if listening.contains(&inode)),
                )
            })
    };
    if program_processes(leader).into_iter().any(holds_one) {
        PortHolder::Program
    } else {
        PortHolder::Other
    }
}

/// The processes of the program led by `leader`: its process group, and the leader's
/// descendants wherever they went.
fn program_processes(leader: u32) -> Vec<i32> {
    let Ok(leader) = i32::try_from(leader) else {
        return Vec::new();
    };
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    // pid -> (parent, group), for every process still there.
    let table: HashMap<i32, (i32, i32)> = all
        .flatten()
        .filter_map(|process| process.stat().ok())
        .map(|stat| (stat.pid, (stat.ppid, stat.pgrp)))
        .collect();
    let descends = |mut pid: i32| {
        // Parent links end at pid 1 (or 0); the bound guards against a table read mid-change.
        for _ in 0..table.len() {
            if pid == leader {
                return true;
            }
            match table.get(&pid) {
                Some(&(parent, _)) if parent > 0 && parent != pid => pid = parent,
                _ => return false,
            }
        }
        false
    };
    table
        .iter()
        .filter(|(pid, (_, group))| *group == leader || descends(**pid))
        .map(|(pid, _)| *pid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket this process listens on is held by this process's program; a port nobody
    /// listens on is nobody's; and a socket held here is another program's as seen from a
    /// leader that is not this process nor an ancestor of it.
    #[test]
    fn the_holder_of_a_listening_socket_is_found() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id();
        assert_eq!(port_holder(port, me), PortHolder::Program);
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert_eq!(port_holder(port, child.id()), PortHolder::Other);
        child.kill().unwrap();
        child.wait().unwrap();
        drop(listener);
        assert_eq!(port_holder(port, me), PortHolder::Nobody);
    }
}
