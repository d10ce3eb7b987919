//! The guards, proved with trybuild: posting a send before RTS, posting a receive in RESET, a
//! transition a state does not have, and another transport's attributes do not compile; nor
//! does dropping a QP under a batch, reading a receive buffer after posting it, or borrowing
//! memory a peer may write.

#[test]
fn typestate_guards_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile-fail/*.rs");
}
