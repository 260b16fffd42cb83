//! Who listens on a local TCP port, from the kernel's socket tables
//! (`/proc/net/tcp`, `/proc/net/tcp6`): a client can check that the server
//! it is about to hand a pipeline to runs as the same user, which no
//! answer over the socket itself could prove.

/// The uids of the processes listening on TCP `port` (any address).
pub fn listening_uids(port: u16) -> Vec<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .flat_map(|text| listeners_in(&text, port))
        .collect()
}

/// The uid column of the LISTEN rows for `port` in one socket table.
fn listeners_in(table: &str, port: u16) -> Vec<u32> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = fields.get(1)?;
            let state = fields.get(3)?;
            let uid = fields.get(7)?;
            let local_port = u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()?;
            (local_port == port && *state == LISTEN)
                .then(|| uid.parse().ok())
                .flatten()
        })
        .collect()
}

/// This process's real uid, from `/proc/self/status`.
pub fn current_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_rows_for_the_port_are_read() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F89 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0
   1: 0100007F:1F89 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1001        0 2 1 0
   2: 00000000:1F8A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0
";
        assert_eq!(listeners_in(table, 8073), vec![1000]);
        assert_eq!(listeners_in(table, 8074), vec![0]);
        assert!(listeners_in(table, 9999).is_empty());
    }

    #[test]
    fn a_port_this_process_listens_on_is_ours() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bound");
        let port = listener.local_addr().expect("an address").port();
        let me = current_uid().expect("a uid");
        assert_eq!(listening_uids(port), vec![me]);
    }
}
