// Memory a peer may write at any time is never borrowed in safe code.
use verbs_safe::DmaBuf;

fn peek(buf: &DmaBuf) -> u8 {
    buf.as_slice()[0]
}

fn main() {}
