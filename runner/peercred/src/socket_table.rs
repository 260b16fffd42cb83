//! The kernel's TCP socket tables (`/proc/net/tcp`, `/proc/net/tcp6`): one
//! row per socket of this network namespace, with its two ends, its state
//! and the uid of the user who opened it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

const TABLES: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];
const ESTABLISHED: u8 = 0x01;
const LISTEN: u8 = 0x0A;

/// One socket's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SocketRow {
    local: SocketAddr,
    remote: SocketAddr,
    state: u8,
    uid: u32,
}

/// Every row of the tables that can be read; `None` when neither can (no
/// `/proc`, or a sandbox that hides it), so callers can tell "nobody" from
/// "cannot know".
fn all_rows() -> Option<Vec<SocketRow>> {
    let mut rows = Vec::new();
    let mut read_any = false;
    for table in TABLES {
        if let Ok(text) = std::fs::read_to_string(table) {
            read_any = true;
            rows.extend(rows_in(&text));
        }
    }
    read_any.then_some(rows)
}

/// Whether this host's socket tables can be read at all.
pub(crate) fn tables_readable() -> bool {
    TABLES.iter().any(|t| std::fs::read_to_string(t).is_ok())
}

/// The uids of the processes listening on TCP `port` (any address).
pub fn listening_uids(port: u16) -> Vec<u32> {
    all_rows()
        .unwrap_or_default()
        .into_iter()
        .filter(|row| row.state == LISTEN && row.local.port() == port)
        .map(|row| row.uid)
        .collect()
}

/// The uid of whoever opened the socket at `peer`, connected to this
/// host's port `server_port`: the owner of the client end of a connection
/// a server accepted. `None` when no such socket is in this host's tables
/// (a peer on another host or in another network namespace) or the tables
/// cannot be read.
pub fn owner_of_peer(peer: SocketAddr, server_port: u16) -> Option<u32> {
    let peer = canonical(peer);
    all_rows()?
        .into_iter()
        .find(|row| {
            row.state == ESTABLISHED
                && canonical(row.local) == peer
                && row.remote.port() == server_port
        })
        .map(|row| row.uid)
}

/// This process's real uid, from `/proc/self/status`.
pub fn current_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// An IPv4 peer of a dual-stack socket shows as `::ffff:a.b.c.d` on one
/// side and `a.b.c.d` on the other.
fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), addr.port()),
            None => addr,
        },
        IpAddr::V4(_) => addr,
    }
}

/// The rows of one table's text; a row that does not parse is skipped.
fn rows_in(table: &str) -> impl Iterator<Item = SocketRow> + '_ {
    table.lines().skip(1).filter_map(|line| {
        let mut fields = line.split_whitespace();
        let local = parse_address(fields.nth(1)?)?;
        let remote = parse_address(fields.next()?)?;
        let state = u8::from_str_radix(fields.next()?, 16).ok()?;
        // tx_queue:rx_queue, tr:tm->when, retrnsmt, then the uid.
        let uid = fields.nth(3)?.parse().ok()?;
        Some(SocketRow {
            local,
            remote,
            state,
            uid,
        })
    })
}

/// `ADDR:PORT` as the kernel prints it: the port in hex, the address as
/// 32-bit words in hex, each word the address bytes in host byte order.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let hex = addr.get(i * 8..i * 8 + 8)?;
        Some(u32::from_str_radix(hex, 16).ok()?.to_ne_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_exact_mut(4).enumerate() {
                chunk.copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";

    #[test]
    fn rows_are_read_with_their_ends_state_and_owner() {
        let table = format!(
            "{HEADER}   0: 0100007F:1F89 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0
   1: 0100007F:9C40 0100007F:1F89 01 00000000:00000000 00:00000000 00000000  1001        0 2 1 0
   2: garbage
"
        );
        let rows: Vec<SocketRow> = rows_in(&table).collect();
        assert_eq!(rows.len(), 2, "{rows:?}");
        if cfg!(target_endian = "little") {
            assert_eq!(rows[1].local, "127.0.0.1:40000".parse().unwrap());
            assert_eq!(rows[1].remote, "127.0.0.1:8073".parse().unwrap());
        }
        assert_eq!((rows[0].state, rows[0].uid), (LISTEN, 1000));
        assert_eq!((rows[1].state, rows[1].uid), (ESTABLISHED, 1001));
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn ipv6_rows_and_mapped_ipv4_addresses_are_read() {
        let loopback = parse_address("00000000000000000000000001000000:1F90").unwrap();
        assert_eq!(loopback, "[::1]:8080".parse().unwrap());
        let mapped = parse_address("0000000000000000FFFF00000100007F:1F90").unwrap();
        assert_eq!(canonical(mapped), "127.0.0.1:8080".parse().unwrap());
        assert_eq!(parse_address("0100007F"), None);
        assert_eq!(parse_address("01007F:0050"), None);
    }

    #[test]
    fn a_port_this_process_listens_on_is_ours() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bound");
        let port = listener.local_addr().expect("an address").port();
        let me = current_uid().expect("a uid");
        assert_eq!(listening_uids(port), vec![me]);
    }

    #[test]
    fn the_client_end_of_an_accepted_connection_is_found() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bound");
        let port = listener.local_addr().expect("an address").port();
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connected");
        let (_server_end, peer) = listener.accept().expect("accepted");
        assert_eq!(owner_of_peer(peer, port), current_uid());
        // The same client address towards another port is no connection.
        assert_eq!(owner_of_peer(peer, port.wrapping_add(1)), None);
    }
}
