//! Netlink framing as nldev uses it: messages (a `struct nlmsghdr` and attributes
//! right after it: nldev has no family header) and attributes (`struct nlattr`,
//! padded to 4 bytes, nested by type). Reading checks every length against what
//! is left; writing builds requests, and replies for the synthetic encoder. No I/O.

use super::attrs::{
    nl_client, nldev_op, nldev_type, NLA_F_NESTED, NLA_HDRLEN, NLA_TYPE_MASK, NLMSG_DONE,
    NLMSG_ERROR, NLMSG_HDRLEN, RDMA_NL_NLDEV,
};
use crate::rdma::RdmaError;

/// Rounds up to the 4-byte alignment of netlink messages and attributes.
pub const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn malformed(what: &'static str, detail: String) -> RdmaError {
    RdmaError::Malformed { what, detail }
}

/// One netlink message of a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    pub kind: u16,
    pub flags: u16,
    pub seq: u32,
    /// The bytes after the header, up to the message's length.
    pub payload: &'a [u8],
}

impl Message<'_> {
    /// The errno an NLMSG_ERROR or NLMSG_DONE carries: 0 for an ack or a plain end,
    /// else the positive errno. None for other types.
    pub fn errno(&self) -> Result<Option<i32>, RdmaError> {
        if self.kind != NLMSG_ERROR && self.kind != NLMSG_DONE {
            return Ok(None);
        }
        // A DONE may have no payload at all (old kernels); an ERROR always has one.
        if self.kind == NLMSG_DONE && self.payload.is_empty() {
            return Ok(Some(0));
        }
        let b = self.payload.get(..4).ok_or_else(|| {
            malformed(
                "netlink error code",
                format!("{} bytes where 4 are needed", self.payload.len()),
            )
        })?;
        let code = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
        // The kernel sends -errno; a positive code is no errno it would send.
        Ok(Some(code.checked_neg().unwrap_or(i32::MAX)))
    }

    /// The nldev command of the message, when it is an nldev message.
    pub fn nldev_op(&self) -> Option<u16> {
        (self.kind >= 0x10 && nl_client(self.kind) == RDMA_NL_NLDEV).then(|| nldev_op(self.kind))
    }
}

/// The messages of a datagram, in order; a length that does not fit is an error.
pub struct Messages<'a> {
    rest: &'a [u8],
}

pub fn messages(datagram: &[u8]) -> Messages<'_> {
    Messages { rest: datagram }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Message<'a>, RdmaError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let b = self.rest;
        let Some(h) = b.get(..NLMSG_HDRLEN) else {
            self.rest = &[];
            return Some(Err(malformed(
                "netlink header",
                format!("{} bytes left where a 16-byte header is needed", b.len()),
            )));
        };
        let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            self.rest = &[];
            return Some(Err(malformed(
                "netlink message",
                format!("length {len} with {} bytes in the datagram", b.len()),
            )));
        }
        let message = Message {
            kind: u16::from_ne_bytes([h[4], h[5]]),
            flags: u16::from_ne_bytes([h[6], h[7]]),
            seq: u32::from_ne_bytes([h[8], h[9], h[10], h[11]]),
            payload: &b[NLMSG_HDRLEN..len],
        };
        self.rest = &b[align4(len).min(b.len())..];
        Some(Ok(message))
    }
}

/// One attribute: its type (flags masked off) and payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr<'a> {
    pub kind: u16,
    pub payload: &'a [u8],
}

/// The attributes of a payload, in order; a length that does not fit is an error.
/// An attribute of length under 4 would never advance: it is refused, so no input
/// loops.
pub struct Attrs<'a> {
    rest: &'a [u8],
}

pub fn attrs(payload: &[u8]) -> Attrs<'_> {
    Attrs { rest: payload }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<Attr<'a>, RdmaError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let b = self.rest;
        let Some(h) = b.get(..NLA_HDRLEN) else {
            self.rest = &[];
            return Some(Err(malformed(
                "attribute header",
                format!("{} bytes left where a 4-byte header is needed", b.len()),
            )));
        };
        let len = usize::from(u16::from_ne_bytes([h[0], h[1]]));
        let kind = u16::from_ne_bytes([h[2], h[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > b.len() {
            self.rest = &[];
            return Some(Err(malformed(
                "attribute",
                format!("type {kind} has length {len} with {} bytes left", b.len()),
            )));
        }
        self.rest = &b[align4(len).min(b.len())..];
        Some(Ok(Attr {
            kind,
            payload: &b[NLA_HDRLEN..len],
        }))
    }
}

impl Attr<'_> {
    fn exact<const N: usize>(&self, what: &'static str) -> Result<[u8; N], RdmaError> {
        <[u8; N]>::try_from(self.payload).map_err(|_| {
            malformed(
                what,
                format!(
                    "attribute {} has {} bytes where {N} are needed",
                    self.kind,
                    self.payload.len()
                ),
            )
        })
    }

    pub fn u8(&self, what: &'static str) -> Result<u8, RdmaError> {
        Ok(self.exact::<1>(what)?[0])
    }

    pub fn u32(&self, what: &'static str) -> Result<u32, RdmaError> {
        Ok(u32::from_ne_bytes(self.exact::<4>(what)?))
    }

    pub fn u64(&self, what: &'static str) -> Result<u64, RdmaError> {
        Ok(u64::from_ne_bytes(self.exact::<8>(what)?))
    }

    /// A NUL-terminated string (`nla_put_string`), read up to its NUL. Names are
    /// bytes to the kernel: anything not UTF-8 is shown with U+FFFD.
    pub fn string(&self) -> String {
        let bytes = match self.payload.iter().position(|&c| c == 0) {
            Some(end) => &self.payload[..end],
            None => self.payload,
        };
        String::from_utf8_lossy(bytes).into_owned()
    }
}

/// Writes netlink messages into a buffer: requests to the kernel, and replies as
/// the kernel fills them (`synthetic`). Lengths are set when a message or nest ends.
pub struct Writer<'a> {
    buf: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Writer<'a> {
    /// Starts a message at the end of `buf` (which holds whole messages so far).
    pub fn message(buf: &'a mut Vec<u8>, kind: u16, flags: u16, seq: u32, port_id: u32) -> Self {
        buf.resize(align4(buf.len()), 0);
        let start = buf.len();
        buf.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_len, set by finish()
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&port_id.to_ne_bytes());
        Writer { buf, start }
    }

    /// Starts an nldev message for command `op`.
    pub fn nldev(buf: &'a mut Vec<u8>, op: u16, flags: u16, seq: u32, port_id: u32) -> Self {
        Writer::message(buf, nldev_type(op), flags, seq, port_id)
    }

    /// Where the message ends so far: [`Writer::truncate`] goes back to such a mark.
    pub fn mark(&self) -> usize {
        self.buf.len()
    }

    /// Bytes in the message so far.
    pub fn len(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Whether the message holds its header only.
    pub fn is_empty(&self) -> bool {
        self.len() <= NLMSG_HDRLEN
    }

    /// Drops what was written after `mark` (the kernel's `nla_nest_cancel`).
    pub fn truncate(&mut self, mark: usize) {
        self.buf.truncate(mark.max(self.start + NLMSG_HDRLEN));
    }

    /// Payload bytes outside any attribute (the errno of NLMSG_DONE and NLMSG_ERROR).
    pub fn raw(&mut self, payload: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(payload);
        self
    }

    pub fn bytes(&mut self, kind: u16, payload: &[u8]) -> &mut Self {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.end_attr(start);
        self
    }

    pub fn u8(&mut self, kind: u16, value: u8) -> &mut Self {
        self.bytes(kind, &[value])
    }

    pub fn u32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.bytes(kind, &value.to_ne_bytes())
    }

    /// `nla_put_u64_64bit` on a machine with efficient unaligned access (x86_64,
    /// arm64): no pad attribute before the value.
    pub fn u64(&mut self, kind: u16, value: u64) -> &mut Self {
        self.bytes(kind, &value.to_ne_bytes())
    }

    /// `nla_put_string`: the bytes and a NUL.
    pub fn string(&mut self, kind: u16, value: &str) -> &mut Self {
        let mut payload = Vec::with_capacity(value.len() + 1);
        payload.extend_from_slice(value.as_bytes());
        payload.push(0);
        self.bytes(kind, &payload)
    }

    /// Opens a nest: `nla_nest_start` (flagged NLA_F_NESTED) or
    /// `nla_nest_start_noflag`. Returns where it starts, for [`Writer::end_nest`].
    pub fn begin_nest(&mut self, kind: u16, flagged: bool) -> usize {
        let start = self.buf.len();
        let kind = if flagged { kind | NLA_F_NESTED } else { kind };
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        start
    }

    pub fn end_nest(&mut self, start: usize) {
        self.end_attr(start);
    }

    fn end_attr(&mut self, start: usize) {
        let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self.buf.resize(align4(self.buf.len()), 0);
    }

    /// Sets the message's length.
    pub fn finish(self) {
        let len = u32::try_from(self.buf.len() - self.start).unwrap_or(u32::MAX);
        self.buf[self.start..self.start + 4].copy_from_slice(&len.to_ne_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::super::attrs::{NLM_F_DUMP, NLM_F_REQUEST, RDMA_NLDEV_ATTR_DEV_INDEX};
    use super::*;

    #[test]
    fn a_request_is_header_and_attributes() {
        let mut buf = Vec::new();
        let mut w = Writer::nldev(&mut buf, 10, NLM_F_REQUEST | NLM_F_DUMP, 7, 0);
        w.u32(RDMA_NLDEV_ATTR_DEV_INDEX, 3);
        w.finish();
        assert_eq!(buf.len(), 24);
        let m = messages(&buf).next().unwrap().unwrap();
        assert_eq!((m.kind, m.flags, m.seq), (0x140a, 0x301, 7));
        let a: Vec<_> = attrs(m.payload).map(Result::unwrap).collect();
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].kind, RDMA_NLDEV_ATTR_DEV_INDEX);
        assert_eq!(a[0].u32("x").unwrap(), 3);
    }

    #[test]
    fn lengths_that_do_not_fit_are_errors() {
        // A zero-length attribute would loop for ever in a careless reader.
        let zero = [0u8, 0, 1, 0, 9, 9, 9, 9];
        assert!(attrs(&zero).next().unwrap().is_err());
        let long = [40u8, 0, 1, 0, 9, 9, 9, 9];
        assert!(attrs(&long).next().unwrap().is_err());
        let short_header = [8u8, 0];
        assert!(attrs(&short_header).next().unwrap().is_err());
        let mut m = vec![0u8; 16];
        m[0] = 15;
        assert!(messages(&m).next().unwrap().is_err());
        m[0] = 32;
        assert!(messages(&m).next().unwrap().is_err());
    }

    #[test]
    fn typed_reads_want_the_exact_size() {
        let a = Attr {
            kind: 1,
            payload: &[1, 2, 3],
        };
        assert!(a.u32("x").is_err());
        assert!(a.u8("x").is_err());
        let s = Attr {
            kind: 2,
            payload: b"rxe0\0\0\0",
        };
        assert_eq!(s.string(), "rxe0");
    }
}
