//! The kernel's round-trip estimate of a process's TCP connections
//! (`tcp_info.tcpi_rtt`, smoothed, in µs), read without touching the
//! process: its socket inodes from `/proc/PID/fd`, then one dump of the
//! TCP sockets over a `NETLINK_SOCK_DIAG` socket asking for
//! `INET_DIAG_INFO`, matched by inode. Root (or CAP_SYS_PTRACE for another
//! account's fd table) is needed to list the fds; the dump itself is open
//! to everyone.
//!
//! A dump walks every bucket of the kernel's established-connections hash
//! table, which is sized by the machine's memory, not by its connections:
//! 2.4 ms a walk on this 24 GiB VM with three sockets, and a
//! `SOCK_DIAG_BY_FAMILY` request walks it once per address family (and
//! once more the bind table for `TCP_BOUND_INACTIVE`). So the dump is one
//! `TCPDIAG_GETSOCK` request (inet_diag's older message, which the kernel
//! answers for both families in one walk), without the bound-inactive
//! state (not a connection): 2.0 ms a sample where the two
//! `SOCK_DIAG_BY_FAMILY` dumps took 5.5 ms (docs/collectors/pgstat.md).
//! A kernel that refuses it gets the two.
//!
//! A socket already found is asked for again by its identity ([`lookup`]:
//! `SOCK_DIAG_BY_FAMILY` without `NLM_F_DUMP`, which the kernel answers
//! from one hash lookup): 0.016 ms of kernel time for 11 sockets where the
//! dump took 1.3 ms, 0.18 against 1.7 ms for 100, and about the same at
//! 1,000 (2.5 against 3.2 ms; a Python replica of both, 500 samples).
use std::collections::BTreeMap;
use std::io;
use std::mem::size_of;

/// A socket's identity as sock_diag names it: its address family and the
/// `inet_diag_sockid` (ports, addresses, interface, cookie) as the kernel
/// sent them, to ask for that one socket again ([`lookup`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SockId {
    family: u8,
    raw: [u8; 48],
}

impl SockId {
    /// No socket: a TcpRtt not read from the kernel.
    pub const NONE: SockId = SockId {
        family: 0,
        raw: [0; 48],
    };
}

/// One TCP socket of the process, as the kernel sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TcpRtt {
    pub inode: u64,
    /// Which socket it is, for [`lookup`].
    pub id: SockId,
    /// The socket's local port and TCP state (`TCP_ESTABLISHED` 1,
    /// `TCP_LISTEN` 10, …), from `inet_diag_msg`.
    pub local_port: u16,
    pub state: u8,
    /// Smoothed round-trip time, ms.
    pub rtt_ms: f64,
    /// Its mean deviation, ms.
    pub rttvar_ms: f64,
    /// The smallest round trip seen in the kernel's window (`tcpi_min_rtt`,
    /// Linux 4.10+; 5 minutes by default), ms: the path's own delay, without
    /// the time the peer took to answer (a delayed ACK riding on its reply).
    pub min_rtt_ms: Option<f64>,
    /// Segments retransmitted over the connection's life
    /// (`tcpi_total_retrans`), and segments sent (`tcpi_segs_out`, 4.2+).
    pub total_retrans: Option<u32>,
    pub segs_out: Option<u32>,
    /// Resent segments the peer reported it already had (`tcpi_dsack_dups`,
    /// its D-SACKs; Linux 4.19+): resent on a late acknowledgement (a tail
    /// loss probe, a timeout that came too soon), not lost.
    pub dsack_dups: Option<u32>,
    /// The retransmission timeout now (`tcpi_rto`), ms: how long a lost
    /// segment waits before it is sent again when no duplicate ACK says so.
    pub rto_ms: Option<f64>,
    /// Retransmission timeouts that fired over the connection's life, and
    /// the time it spent recovering from them, ms (`tcpi_total_rto`,
    /// `tcpi_total_rto_time`; Linux 6.7+).
    pub total_rto: Option<u32>,
    pub total_rto_time_ms: Option<u32>,
}

const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// inet_diag's older request (`struct inet_diag_req`), answered for
/// `AF_UNSPEC`: IPv4 and IPv6 in one walk of the hash tables.
const TCPDIAG_GETSOCK: u16 = 18;
/// Every TCP state (`1 << TCP_ESTABLISHED` … `1 << TCP_NEW_SYN_RECV`) but
/// `TCP_BOUND_INACTIVE` (13, Linux 6.5+: bound, never connected), whose
/// sockets are found by walking the bind table as well.
const STATES: u32 = 0x1ffe;
/// `INET_DIAG_INFO`: the attribute carrying `struct tcp_info`.
const INET_DIAG_INFO: u16 = 2;

/// `struct inet_diag_req_v2` with its `inet_diag_sockid` as bytes (ports,
/// addresses, interface, cookie in the kernel's order: a [`SockId`]'s).
#[repr(C)]
#[derive(Clone, Copy)]
struct Req {
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: [u8; 48],
}

/// A netlink header and its request.
#[repr(C)]
struct Request<R> {
    nlh: libc::nlmsghdr,
    req: R,
}

// The kernel's sizes, with no padding anywhere (sent as bytes).
const _: () = assert!(size_of::<Request<Req>>() == 16 + 56);
const _: () = assert!(size_of::<Request<CompatReq>>() == 16 + 60);

/// `struct inet_diag_req`: family, address lengths, extensions, the
/// 48-byte sockid (ports, addresses, interface, cookie), states, dbs.
#[repr(C)]
#[derive(Clone, Copy)]
struct CompatReq {
    family: u8,
    src_len: u8,
    dst_len: u8,
    ext: u8,
    id: [u8; 48],
    states: u32,
    dbs: u32,
}

/// Offset of `idiag_inode` in `struct inet_diag_msg` (family, state,
/// timer, retrans: 4 bytes; the 48-byte sockid; expires, rqueue, wqueue,
/// uid: 16 bytes).
const MSG_INODE: usize = 4 + 48 + 16;
const MSG_LEN: usize = MSG_INODE + 4;

/// Socket inodes among `pid`'s open files.
pub fn socket_inodes(pid: u32) -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))?.flatten() {
        if let Ok(t) = std::fs::read_link(e.path()) {
            let t = t.to_string_lossy();
            if let Some(n) = t
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|s| s.parse().ok())
            {
                out.push(n);
            }
        }
    }
    Ok(out)
}

/// Every TCP socket (IPv4 and IPv6) of this network namespace, by inode:
/// dumped once per sample and shared by every walsender. One walk of the
/// kernel's tables for both families where the kernel answers it.
pub fn tcp_sockets() -> io::Result<BTreeMap<u64, TcpRtt>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    // Set once the kernel refused the one walk and answered the two dumps:
    // a sample a second need not be refused again first.
    static REFUSED: AtomicBool = AtomicBool::new(false);
    if !REFUSED.load(Ordering::Relaxed) {
        let mut all = BTreeMap::new();
        if dump_both(&mut all).is_ok() {
            return Ok(all);
        }
        let two = tcp_sockets_by_family();
        REFUSED.store(two.is_ok(), Ordering::Relaxed);
        return two;
    }
    tcp_sockets_by_family()
}

/// [`tcp_sockets`] as one `SOCK_DIAG_BY_FAMILY` dump per family.
fn tcp_sockets_by_family() -> io::Result<BTreeMap<u64, TcpRtt>> {
    let mut all = BTreeMap::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        dump(family as u8, &mut all)?;
    }
    Ok(all)
}

/// The TCP sockets of `pid` with their round-trip times; `all` is the
/// sample's sockets, read by `read` ([`tcp_sockets`], or a [`lookup`] of
/// those known) only when `pid` has a socket at all.
pub fn tcp_rtt_of(
    pid: u32,
    all: &mut Option<io::Result<BTreeMap<u64, TcpRtt>>>,
    read: impl FnOnce() -> io::Result<BTreeMap<u64, TcpRtt>>,
) -> io::Result<Vec<TcpRtt>> {
    let inodes = socket_inodes(pid)?;
    if inodes.is_empty() {
        return Ok(Vec::new());
    }
    match all.get_or_insert_with(read) {
        Ok(all) => Ok(inodes.iter().filter_map(|i| all.get(i).copied()).collect()),
        Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
    }
}

/// Every TCP socket of one family in this network namespace, by inode.
fn dump(family: u8, out: &mut BTreeMap<u64, TcpRtt>) -> io::Result<()> {
    let req = Req {
        family,
        protocol: libc::IPPROTO_TCP as u8,
        ext: 1 << (INET_DIAG_INFO - 1),
        pad: 0,
        states: STATES,
        id: [0; 48],
    };
    dump_with(SOCK_DIAG_BY_FAMILY, req, out)
}

/// Every TCP socket of both families, in one `TCPDIAG_GETSOCK` dump.
fn dump_both(out: &mut BTreeMap<u64, TcpRtt>) -> io::Result<()> {
    let req = CompatReq {
        family: libc::AF_UNSPEC as u8,
        src_len: 0,
        dst_len: 0,
        ext: 1 << (INET_DIAG_INFO - 1),
        id: [0; 48],
        states: STATES,
        dbs: 0,
    };
    dump_with(TCPDIAG_GETSOCK, req, out)
}

/// A dump request of type `kind` carrying `req` (a repr(C) request struct
/// of plain integers, without padding after the header).
fn dump_with<R: Copy>(kind: u16, req: R, out: &mut BTreeMap<u64, TcpRtt>) -> io::Result<()> {
    let msg = Request {
        nlh: libc::nlmsghdr {
            nlmsg_len: size_of::<Request<R>>() as u32,
            nlmsg_type: kind,
            nlmsg_flags: (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16,
            nlmsg_seq: 1,
            nlmsg_pid: 0,
        },
        req,
    };
    request(as_bytes(&msg), out)
}

/// Requests per datagram of [`lookup`]: their answers, queued before any
/// is read, must fit the socket's default receive buffer (1,000 at once
/// failed with ENOBUFS).
const LOOKUPS_AT_ONCE: usize = 32;

/// The sockets named by `ids` that still exist, by inode: one exact
/// request each (no walk of the kernel's tables), [`LOOKUPS_AT_ONCE`] to a
/// datagram. A socket closed since, or whose ports a new one took (its
/// cookie differs), is left out.
pub fn lookup(ids: &[SockId]) -> io::Result<BTreeMap<u64, TcpRtt>> {
    let mut out = BTreeMap::new();
    if ids.is_empty() {
        return Ok(out);
    }
    let fd = diag_socket()?;
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let mut buf = vec![0u8; 64 * 1024];
    for chunk in ids.chunks(LOOKUPS_AT_ONCE) {
        let mut msg = Vec::with_capacity(chunk.len() * size_of::<Request<Req>>());
        for (i, id) in chunk.iter().enumerate() {
            let req = Request {
                nlh: libc::nlmsghdr {
                    nlmsg_len: size_of::<Request<Req>>() as u32,
                    nlmsg_type: SOCK_DIAG_BY_FAMILY,
                    nlmsg_flags: libc::NLM_F_REQUEST as u16,
                    nlmsg_seq: i as u32 + 1,
                    nlmsg_pid: 0,
                },
                req: Req {
                    family: id.family,
                    protocol: libc::IPPROTO_TCP as u8,
                    ext: 1 << (INET_DIAG_INFO - 1),
                    pad: 0,
                    states: STATES,
                    // The sockid as the kernel sent it.
                    id: id.raw,
                },
            };
            msg.extend_from_slice(as_bytes(&req));
        }
        send(raw, &msg)?;
        // One answer per request: the socket, or an error (ENOENT: gone).
        let mut answered = 0;
        while answered < chunk.len() {
            let n = recv(raw, &mut buf)?;
            answered += parse_answers(&buf[..n], &mut out)?;
        }
    }
    Ok(out)
}

/// A fresh `NETLINK_SOCK_DIAG` socket.
fn diag_socket() -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: plain socket(2); the fd is closed by OwnedFd.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// A request's bytes (a repr(C) header and request of plain integers,
/// without padding: the size checks above).
fn as_bytes<R>(msg: &Request<R>) -> &[u8] {
    // SAFETY: reads the struct's own bytes for as long as it lives; no
    // padding (Req: 56 bytes, CompatReq: 60, both 4-aligned after the
    // 16-byte header).
    unsafe {
        std::slice::from_raw_parts(
            (msg as *const Request<R>).cast::<u8>(),
            size_of::<Request<R>>(),
        )
    }
}

/// Send `msg` to the kernel (address 0).
fn send(fd: i32, msg: &[u8]) -> io::Result<()> {
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: sends the message's bytes to the kernel.
    let n = unsafe {
        libc::sendto(
            fd,
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One datagram into `buf`; its length.
fn recv(fd: i32, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: recv into our buffer, at most its length.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Send one dump request (`msg`, header included) and parse its answer.
fn request(msg: &[u8], out: &mut BTreeMap<u64, TcpRtt>) -> io::Result<()> {
    let fd = diag_socket()?;
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    send(raw, msg)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = recv(raw, &mut buf)?;
        if parse(&buf[..n], out)? {
            return Ok(());
        }
    }
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_ne_bytes([b[o], b[o + 1]])
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

const HDR: usize = size_of::<libc::nlmsghdr>();

/// The netlink messages of one datagram: each one's type and body.
fn messages(mut b: &[u8]) -> impl Iterator<Item = io::Result<(u16, &[u8])>> {
    std::iter::from_fn(move || {
        if b.len() < HDR {
            return None;
        }
        let len = u32_at(b, 0) as usize;
        if len < HDR || len > b.len() {
            b = &[];
            return Some(Err(io::Error::other("a truncated sock_diag message")));
        }
        let m = (u16_at(b, 4), &b[HDR..len]);
        b = b.get((len + 3) & !3..).unwrap_or(&[]);
        Some(Ok(m))
    })
}

/// An `NLMSG_ERROR`'s errno (0: an acknowledgement).
fn errno(body: &[u8]) -> i32 {
    if body.len() >= 4 {
        -(u32_at(body, 0) as i32)
    } else {
        0
    }
}

/// One datagram of the dump's answer; true at its end.
fn parse(b: &[u8], out: &mut BTreeMap<u64, TcpRtt>) -> io::Result<bool> {
    for m in messages(b) {
        let (kind, body) = m?;
        match kind as i32 {
            libc::NLMSG_DONE => return Ok(true),
            libc::NLMSG_ERROR => {
                return match errno(body) {
                    0 => Ok(true),
                    e => Err(io::Error::from_raw_os_error(e)),
                }
            }
            // The answer carries the request's type.
            _ if kind == SOCK_DIAG_BY_FAMILY || kind == TCPDIAG_GETSOCK => socket(body, out),
            _ => {}
        }
    }
    Ok(false)
}

/// The answers in one datagram of [`lookup`]'s: how many (a socket, or an
/// error for one gone), the sockets into `out`. Another error than a gone
/// socket's fails the lookup.
fn parse_answers(b: &[u8], out: &mut BTreeMap<u64, TcpRtt>) -> io::Result<usize> {
    let mut answers = 0;
    for m in messages(b) {
        let (kind, body) = m?;
        match kind as i32 {
            libc::NLMSG_ERROR => {
                answers += 1;
                // Closed (ENOENT), or its ports now a new socket's (ESTALE).
                let e = errno(body);
                if ![0, libc::ENOENT, libc::ESTALE].contains(&e) {
                    return Err(io::Error::from_raw_os_error(e));
                }
            }
            _ if kind == SOCK_DIAG_BY_FAMILY => {
                answers += 1;
                socket(body, out);
            }
            _ => {}
        }
    }
    Ok(answers)
}

/// One `inet_diag_msg` and its attributes into `out` (by inode), when it
/// carries a `tcp_info`.
fn socket(m: &[u8], out: &mut BTreeMap<u64, TcpRtt>) {
    if m.len() < MSG_LEN {
        return;
    }
    let inode = u64::from(u32_at(m, MSG_INODE));
    // idiag_family at 0, idiag_state at 1; the sockid from 4, idiag_sport
    // (network order) first.
    let (state, port) = (m[1], u16::from_be_bytes([m[4], m[5]]));
    let mut id = SockId {
        family: m[0],
        raw: [0; 48],
    };
    id.raw.copy_from_slice(&m[4..52]);
    let mut a = &m[MSG_LEN..];
    while a.len() >= 4 {
        let alen = usize::from(u16_at(a, 0));
        let akind = u16_at(a, 2);
        if alen < 4 || alen > a.len() {
            break;
        }
        if akind == INET_DIAG_INFO {
            if let Some(mut r) = rtt(inode, &a[4..alen]) {
                r.local_port = port;
                r.state = state;
                r.id = id;
                out.insert(inode, r);
            }
        }
        a = a.get((alen + 3) & !3..).unwrap_or(&[]);
    }
}

/// Offset of `tcpi_min_rtt` in `struct tcp_info` (after
/// `tcpi_total_retrans` at 100: four u64 rates and byte counts from 104,
/// `tcpi_segs_out`, `tcpi_segs_in`, `tcpi_notsent_bytes`).
const MIN_RTT: usize = 148;
/// Offset of `tcpi_segs_out` (after the four u64 from 104).
const SEGS_OUT: usize = 136;
/// Offsets of `tcpi_total_rto` (u16) and `tcpi_total_rto_time` (u32, ms),
/// after `tcpi_rehash` at 236 (Linux 6.7+).
const TOTAL_RTO: usize = 240;
/// Offset of `tcpi_dsack_dups` (after `tcpi_bytes_sent` and
/// `tcpi_bytes_retrans`, u64s at 200 and 208; Linux 4.19+).
const DSACK_DUPS: usize = 216;
const TOTAL_RTO_TIME: usize = 244;

/// `tcpi_rtt`, `tcpi_rttvar` and `tcpi_min_rtt` (µs) from a `struct tcp_info`.
fn rtt(inode: u64, info: &[u8]) -> Option<TcpRtt> {
    let off = std::mem::offset_of!(libc::tcp_info, tcpi_rtt);
    let var = std::mem::offset_of!(libc::tcp_info, tcpi_rttvar);
    let retrans = std::mem::offset_of!(libc::tcp_info, tcpi_total_retrans);
    let rto = std::mem::offset_of!(libc::tcp_info, tcpi_rto);
    let at = |o: usize| (info.len() >= o + 4).then(|| u32_at(info, o));
    (info.len() >= var + 4).then(|| TcpRtt {
        total_retrans: at(retrans),
        segs_out: at(SEGS_OUT),
        dsack_dups: at(DSACK_DUPS),
        rto_ms: at(rto).map(|us| f64::from(us) / 1000.0),
        total_rto: (info.len() >= TOTAL_RTO_TIME + 4)
            .then(|| u32::from(u16::from_ne_bytes([info[TOTAL_RTO], info[TOTAL_RTO + 1]]))),
        total_rto_time_ms: (info.len() >= TOTAL_RTO_TIME + 4).then(|| u32_at(info, TOTAL_RTO_TIME)),
        inode,
        id: SockId::NONE,
        local_port: 0,
        state: 0,
        rtt_ms: f64::from(u32_at(info, off)) / 1000.0,
        rttvar_ms: f64::from(u32_at(info, var)) / 1000.0,
        min_rtt_ms: (info.len() >= MIN_RTT + 4)
            .then(|| u32_at(info, MIN_RTT))
            .filter(|us| *us != u32::MAX && *us > 0)
            .map(|us| f64::from(us) / 1000.0),
    })
}

/// The socket inode of an open descriptor (the tests' own sockets).
#[cfg(test)]
pub(crate) fn inode(fd: &impl std::os::fd::AsRawFd) -> u64 {
    // SAFETY: fstat into a zeroed struct, on a descriptor we hold.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st.st_ino
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_walk_finds_what_the_two_family_dumps_find() {
        use std::net::{TcpListener, TcpStream};
        // A listener and a connection of each family (IPv6 where the host
        // has ::1): this test's own sockets, whatever other tests open.
        let mut held = Vec::new();
        let mut open = Vec::new();
        let mut families = Vec::new();
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(l) = TcpListener::bind(addr) else {
                continue;
            };
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            families.push(addr);
            held.push((inode(&l), l.local_addr().unwrap().port(), 10u8));
            held.push((inode(&s), l.local_addr().unwrap().port(), 1));
            held.push((inode(&c), c.local_addr().unwrap().port(), 1));
            open.push((l, c, s));
        }
        let mut both = BTreeMap::new();
        dump_both(&mut both).expect("TCPDIAG_GETSOCK dump");
        let by_family = tcp_sockets_by_family().unwrap();
        for (ino, port, state) in &held {
            for (how, dump) in [("one walk", &both), ("by family", &by_family)] {
                let r = dump
                    .get(ino)
                    .unwrap_or_else(|| panic!("{how}: socket {ino} (port {port}) not found"));
                assert_eq!(
                    (r.local_port, r.state),
                    (*port, *state),
                    "{how}: {families:?}"
                );
            }
        }
        assert!(held.len() >= 3, "{families:?}");
        // The public entry takes the one walk.
        let all = tcp_sockets().unwrap();
        assert!(held.iter().all(|(i, _, _)| all.contains_key(i)));
        drop(open);
    }

    #[test]
    fn a_lookup_answers_for_the_sockets_a_dump_found() {
        use std::net::{TcpListener, TcpStream};
        // More connections than one datagram of lookups, of each family.
        let mut open = Vec::new();
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(l) = TcpListener::bind(addr) else {
                continue;
            };
            for _ in 0..LOOKUPS_AT_ONCE + 3 {
                let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
                let (s, _) = l.accept().unwrap();
                open.push((c, s));
            }
        }
        let all = tcp_sockets().unwrap();
        let ends: Vec<u64> = open.iter().map(|(_, s)| inode(s)).collect();
        let ids: Vec<SockId> = ends.iter().map(|i| all[i].id).collect();
        let found = lookup(&ids).unwrap();
        assert_eq!(found.len(), ends.len(), "{found:?}");
        for i in &ends {
            let (a, b) = (&all[i], &found[i]);
            assert_eq!((a.local_port, a.state, a.id), (b.local_port, b.state, b.id));
        }
        // Closed since: left out, the others still answered.
        let (c, s) = open.pop().unwrap();
        let gone = inode(&s);
        drop((c, s));
        let found = lookup(&ids).unwrap();
        assert!(!found.contains_key(&gone));
        assert_eq!(found.len(), ends.len() - 1);
        assert!(lookup(&[]).unwrap().is_empty());
    }

    #[test]
    fn reads_a_connected_sockets_round_trip() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        use std::io::{Read, Write};
        for _ in 0..3 {
            c.write_all(b"ping").unwrap();
            let mut b = [0u8; 4];
            s.read_exact(&mut b).unwrap();
            s.write_all(b"pong").unwrap();
            c.read_exact(&mut b).unwrap();
        }
        // This test's three sockets: other tests of the process open theirs.
        let own = [inode(&l), inode(&c), inode(&s)];
        let mine: Vec<TcpRtt> = tcp_rtt_of(std::process::id(), &mut None, tcp_sockets)
            .unwrap()
            .into_iter()
            .filter(|r| own.contains(&r.inode))
            .collect();
        assert_eq!(mine.len(), 3, "{mine:?}");
        // The listener has no round trip (0); the two ends have one.
        let ends = mine
            .iter()
            .filter(|r| r.rtt_ms > 0.0 && r.rtt_ms < 200.0)
            .count();
        assert!(ends >= 2, "{mine:?}");
        // The window's minimum is there and no larger than the average.
        assert!(
            mine.iter()
                .filter_map(|r| r.min_rtt_ms.map(|m| (m, r.rtt_ms)))
                .any(|(m, rtt)| m > 0.0 && m <= rtt + 1.0),
            "{mine:?}"
        );
        // Each end sent its three messages (and the handshake), none again;
        // the timeout is the kernel's floor or above (200 ms, Linux).
        let sent: Vec<_> = mine.iter().filter(|r| r.rtt_ms > 0.0).collect();
        assert!(
            sent.iter().all(|r| r.total_retrans == Some(0)
                && r.dsack_dups == Some(0)
                && r.segs_out.is_some_and(|n| n >= 3)),
            "{mine:?}"
        );
        assert!(
            sent.iter().all(|r| r.rto_ms.is_some_and(|ms| ms >= 200.0)),
            "{mine:?}"
        );
        // The listener and the accepted end hold the listening port, the
        // one LISTEN (10), the other ESTABLISHED (1); the client's end not.
        let port = l.local_addr().unwrap().port();
        let mut states: Vec<u8> = mine
            .iter()
            .filter(|r| r.local_port == port)
            .map(|r| r.state)
            .collect();
        states.sort();
        assert_eq!(states, [1, 10], "{mine:?}");
        assert_eq!(
            mine.iter().filter(|r| r.local_port != port).count(),
            1,
            "{mine:?}"
        );
    }
}
