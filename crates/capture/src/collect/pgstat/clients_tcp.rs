//! The server's TCP connections to its clients, read with the walsenders'
//! (sock_diag, one dump a second): the server-side ends of the established
//! connections on the ports the postmaster listens on, their segments sent
//! and resent, and the time spent recovering from retransmission timeouts.
//! Nothing is read from the backends themselves (no /proc/PID/fd walk per
//! connection): the postmaster's listening sockets name the ports.
use std::collections::{BTreeMap, HashMap};
use std::io;

use crate::collect::sockdiag::{self, TcpRtt};
use crate::recording::schema::pgstat::ClientsTcp;

const TCP_ESTABLISHED: u8 = 1;
const TCP_LISTEN: u8 = 10;

/// Per connection, its counters at the last sample.
#[derive(Default)]
pub struct ClientLinks {
    /// The ports the postmaster listens on, learnt once from its sockets
    /// (listen_addresses and port change only with a restart, which ends
    /// the session's server); None: not read yet. Empty: none in this
    /// network namespace, or its fds unreadable — then nothing is read
    /// again, rather than its fd table and the dump every second.
    ports: Option<Vec<u16>>,
    /// Connection (socket inode) -> its counters at the last sample.
    last: HashMap<u64, TcpRtt>,
    /// Whether a sample was taken: the first one is the baseline.
    started: bool,
}

impl ClientLinks {
    /// This sample's figures, None when the postmaster listens on no TCP
    /// port pgbelow can see. `all` is the sample's shared dump.
    pub fn sample(
        &mut self,
        postmaster: u32,
        all: &mut Option<io::Result<BTreeMap<u64, TcpRtt>>>,
    ) -> Option<ClientsTcp> {
        if self.ports.is_none() {
            self.ports = Some(listening_ports(postmaster, all));
        }
        if self.ports.as_ref().is_none_or(Vec::is_empty) {
            return None;
        }
        let dump = all
            .get_or_insert_with(sockdiag::tcp_sockets)
            .as_ref()
            .ok()?;
        Some(self.add(dump.values()))
    }

    /// Whether `port` is one the postmaster listens on.
    fn listens_on(&self, port: u16) -> bool {
        self.ports
            .as_ref()
            .is_some_and(|p| p.binary_search(&port).is_ok())
    }

    /// The deltas of the connections in `sockets` since the last call.
    fn add<'a>(&mut self, sockets: impl Iterator<Item = &'a TcpRtt>) -> ClientsTcp {
        let first = !self.started;
        self.started = true;
        let mut out = ClientsTcp::default();
        let mut rtts = Vec::new();
        let mut rto_time = None::<u64>;
        let mut dsack = None::<u64>;
        let mut now = HashMap::new();
        for s in sockets {
            if s.state != TCP_ESTABLISHED || !self.listens_on(s.local_port) {
                continue;
            }
            if s.total_retrans.is_none() || s.segs_out.is_none() {
                continue;
            }
            out.sockets += 1;
            if s.rtt_ms > 0.0 {
                rtts.push(s.rtt_ms);
            }
            // A connection opened since the last sample counts whole; at
            // the first sample every one is the baseline.
            let base = self.last.get(&s.inode).or(first.then_some(s));
            let delta = |f: fn(&TcpRtt) -> Option<u32>| {
                Some(u64::from(f(s)?.saturating_sub(base.map_or(Some(0), f)?)))
            };
            out.retrans += delta(|x| x.total_retrans).unwrap_or(0);
            out.segs_out += delta(|x| x.segs_out).unwrap_or(0);
            if let Some(t) = delta(|x| x.total_rto_time_ms) {
                *rto_time.get_or_insert(0) += t;
            }
            if let Some(d) = delta(|x| x.dsack_dups) {
                *dsack.get_or_insert(0) += d;
            }
            now.insert(s.inode, *s);
        }
        self.last = now;
        out.rto_time_ms = rto_time;
        out.dsack = dsack;
        rtts.sort_by(f64::total_cmp);
        out.rtt_ms = rtts.get(rtts.len() / 2).map(|r| crate::round3(*r));
        out
    }
}

/// The TCP ports of the postmaster's listening sockets, sorted; empty when
/// it has none here or its fds cannot be read.
fn listening_ports(
    postmaster: u32,
    all: &mut Option<io::Result<BTreeMap<u64, TcpRtt>>>,
) -> Vec<u16> {
    let inodes = sockdiag::socket_inodes(postmaster).unwrap_or_default();
    if inodes.is_empty() {
        return Vec::new();
    }
    let Ok(dump) = all.get_or_insert_with(sockdiag::tcp_sockets).as_ref() else {
        return Vec::new();
    };
    let mut ports: Vec<u16> = inodes
        .iter()
        .filter_map(|i| dump.get(i))
        .filter(|s| s.state == TCP_LISTEN)
        .map(|s| s.local_port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sock(inode: u64, port: u16, state: u8, retrans: u32, segs: u32) -> TcpRtt {
        TcpRtt {
            inode,
            local_port: port,
            state,
            rtt_ms: 0.1,
            rttvar_ms: 0.05,
            min_rtt_ms: None,
            total_retrans: Some(retrans),
            segs_out: Some(segs),
            rto_ms: Some(200.0),
            total_rto: Some(0),
            total_rto_time_ms: Some(retrans * 10),
            dsack_dups: Some(retrans / 2),
        }
    }

    #[test]
    fn deltas_of_the_servers_ends_only() {
        let mut c = ClientLinks {
            ports: Some(vec![5432]),
            ..Default::default()
        };
        // The baseline: counts nothing of what came before.
        let a = [
            sock(1, 5432, TCP_ESTABLISHED, 2, 100),
            sock(2, 5432, TCP_LISTEN, 0, 0),
            sock(3, 40000, TCP_ESTABLISHED, 9, 900),
        ];
        let s = c.add(a.iter());
        assert_eq!((s.sockets, s.retrans, s.segs_out), (1, 0, 0));
        // Connection 1 resent 3 of 50 more; connection 4 opened since
        // (counted whole); the client's end (port 40000) and the listener
        // never.
        let b = [
            sock(1, 5432, TCP_ESTABLISHED, 5, 150),
            sock(4, 5432, TCP_ESTABLISHED, 1, 20),
            sock(3, 40000, TCP_ESTABLISHED, 19, 1900),
        ];
        let s = c.add(b.iter());
        assert_eq!((s.sockets, s.retrans, s.segs_out), (2, 4, 70));
        assert_eq!(s.rto_time_ms, Some(40));
        // D-SACKs: connection 1's went 1 → 2, connection 4's 0 (whole).
        assert_eq!(s.dsack, Some(1));
        assert_eq!(s.rtt_ms, Some(0.1));
        // Connection 1 closed: nothing negative, nothing counted twice.
        let s = c.add([sock(4, 5432, TCP_ESTABLISHED, 1, 30)].iter());
        assert_eq!((s.sockets, s.retrans, s.segs_out), (1, 0, 10));
    }
}
