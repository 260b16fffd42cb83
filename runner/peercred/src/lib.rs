//! Who is on the other end of a local TCP connection, and a gate that
//! admits only this user's processes.
//!
//! Refract runs user code: whoever can submit a job, act as one of its
//! workers or press "cancel" in its UI acts as the user who started the
//! server. A Unix-domain socket in a private directory would keep other
//! users of the machine out, but Beam's clients (Python, Java, Go,
//! TypeScript) dial TCP `host:port` only. On loopback the kernel still
//! knows which user owns each end of a connection: its socket tables
//! (`/proc/net/tcp`, `/proc/net/tcp6`) list every socket with its owner's
//! uid. [`PeerGate`] reads the row of the connecting socket as it is
//! accepted and closes connections of other users before a byte is read,
//! which no credential sent over the socket could do better: the kernel
//! cannot be lied to about who opened a socket.
//!
//! Connections from other hosts have no row in this host's tables; the
//! gate admits them, and what they may do is up to the service's own
//! credentials (worker secrets on the Fn API) and to where the operator
//! lets the port be reached.

mod gate;
mod socket_table;

pub use gate::{LocalPeers, PeerGate, Refusal};
pub use socket_table::{current_uid, listening_uids, owner_of_peer};
