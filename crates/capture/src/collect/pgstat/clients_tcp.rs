//! The server's TCP connections to its clients, read with the walsenders'
//! once a second (sock_diag): the server-side ends of the established
//! connections on the ports the postmaster listens on, their segments sent
//! and resent, and the time spent recovering from retransmission timeouts.
//! Nothing is read from the backends themselves (no /proc/PID/fd walk per
//! connection): the postmaster's listening sockets name the ports.
//!
//! The dump of every TCP socket walks the kernel's whole
//! established-connections table, whose size follows the machine's memory,
//! not the connections; so it is taken only to find connections: at the
//! first sample, after `pg_stat_activity` showed a backend it had not
//! shown (a connection opened), and every [`DISCOVER_EVERY`]. In the other
//! seconds the connections already found are asked for by their identity
//! ([`sockdiag::lookup`]), a hash lookup each.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::time::{Duration, Instant};

use crate::collect::sockdiag::{self, TcpRtt};
use crate::recording::schema::pgstat::ClientsTcp;

/// The longest between two dumps, whatever `pg_stat_activity` shows.
const DISCOVER_EVERY: Duration = Duration::from_secs(30);

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
    /// The server-side ends of the connections found so far.
    known: Vec<sockdiag::SockId>,
    /// When the last dump was taken.
    dumped_at: Option<Instant>,
    /// A backend `pg_stat_activity` had not shown appeared since then.
    opened: bool,
    /// The backends of the last `pg_stat_activity` sample; None until one
    /// (without it, every read is a dump).
    backends: Option<HashSet<u32>>,
}

impl ClientLinks {
    /// This sample's figures, None when the postmaster listens on no TCP
    /// port pgbelow can see. `all` is the sample's sockets, shared with
    /// the walsenders ([`ClientLinks::read`]).
    pub fn sample(
        &mut self,
        postmaster: u32,
        all: &mut Option<io::Result<BTreeMap<u64, TcpRtt>>>,
    ) -> Option<ClientsTcp> {
        if self.ports.as_ref().is_some_and(Vec::is_empty) {
            return None;
        }
        let read = all.get_or_insert_with(|| self.read(postmaster));
        let sockets = read.as_ref().ok()?;
        if self.ports.as_ref().is_none_or(Vec::is_empty) {
            return None;
        }
        Some(self.add(sockets.values()))
    }

    /// The backends (host pids) of a `pg_stat_activity` sample: one not in
    /// the last sample is a connection that opened, found by the next read.
    pub fn saw_backends(&mut self, pids: impl Iterator<Item = u32>) {
        let now: HashSet<u32> = pids.collect();
        if let Some(last) = &self.backends {
            self.opened |= now.iter().any(|p| !last.contains(p));
        }
        self.backends = Some(now);
    }

    /// The sample's TCP sockets: every one (a dump) when connections are to
    /// be found (see the module's doc), else the connections found before
    /// that still exist. Empty, without asking the kernel, when the
    /// postmaster listens on no TCP port here.
    pub fn read(&mut self, postmaster: u32) -> io::Result<BTreeMap<u64, TcpRtt>> {
        // The postmaster's socket inodes, read once (at the first read):
        // none (its fds unreadable) is no port.
        let inodes = match self.ports {
            None => sockdiag::socket_inodes(postmaster).unwrap_or_default(),
            Some(_) => Vec::new(),
        };
        if self.ports.is_none() && inodes.is_empty() {
            self.ports = Some(Vec::new());
        }
        if self.ports.as_ref().is_some_and(Vec::is_empty) {
            return Ok(BTreeMap::new());
        }
        let now = Instant::now();
        if !self.dump_due(now) {
            // A kernel that refuses the lookup gets the dump.
            if let Ok(found) = sockdiag::lookup(&self.known) {
                self.known = found.values().map(|s| s.id).collect();
                return Ok(found);
            }
        }
        let all = sockdiag::tcp_sockets()?;
        if self.ports.is_none() {
            self.ports = Some(listening_ports(&inodes, &all));
        }
        self.known = all
            .values()
            .filter(|s| s.state == TCP_ESTABLISHED && self.listens_on(s.local_port))
            .map(|s| s.id)
            .collect();
        self.dumped_at = Some(now);
        self.opened = false;
        Ok(all)
    }

    /// Whether the next read is a dump.
    fn dump_due(&self, now: Instant) -> bool {
        self.ports.is_none()
            || self.backends.is_none()
            || self.opened
            || self.dumped_at.is_none_or(|t| now >= t + DISCOVER_EVERY)
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

/// The TCP ports of the postmaster's listening sockets (`inodes`, its
/// socket inodes) in `dump`, sorted; empty when it has none here.
fn listening_ports(inodes: &[u64], dump: &BTreeMap<u64, TcpRtt>) -> Vec<u16> {
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
            id: sockdiag::SockId::NONE,
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

    /// This test process as the postmaster: its listener's connections are
    /// found by a dump, then read by lookups until a new backend shows.
    #[test]
    fn a_dump_finds_connections_and_lookups_follow_them() {
        use sockdiag::inode;
        use std::net::{TcpListener, TcpStream};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let _c1 = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s1, _) = l.accept().unwrap();
        let me = std::process::id();
        let mut c = ClientLinks::default();
        c.saw_backends([1, 2].into_iter());
        // The first read: a dump (the listener is in it), the port learnt.
        let first = c.read(me).unwrap();
        assert!(first.contains_key(&inode(&l)), "{first:?}");
        assert!(c.listens_on(l.local_addr().unwrap().port()));
        // The same backends: the connection found is asked for alone.
        c.saw_backends([2, 1].into_iter());
        let second = c.read(me).unwrap();
        assert!(second.contains_key(&inode(&s1)), "{second:?}");
        assert!(!second.contains_key(&inode(&l)), "a dump, not lookups");
        assert!(second.values().all(|s| s.state == TCP_ESTABLISHED));
        // A new backend: the next read is a dump, which finds the new
        // connection; a closed one drops out of the lookups after.
        let _c2 = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s2, _) = l.accept().unwrap();
        c.saw_backends([1, 2, 3].into_iter());
        let third = c.read(me).unwrap();
        assert!(third.contains_key(&inode(&l)) && third.contains_key(&inode(&s2)));
        let gone = inode(&s1);
        drop(s1);
        let fourth = c.read(me).unwrap();
        assert!(fourth.contains_key(&inode(&s2)) && !fourth.contains_key(&gone));
        assert!(!fourth.contains_key(&inode(&l)), "a dump, not lookups");
        // At the latest every DISCOVER_EVERY, a dump.
        c.dumped_at = Some(Instant::now() - DISCOVER_EVERY);
        assert!(c.dump_due(Instant::now()));
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
