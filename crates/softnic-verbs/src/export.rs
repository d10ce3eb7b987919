//! The `export!` macro: a C function of the library, bound to its libibverbs symbol version.

/// Defines each function as `softnic_<name>` with the C ABI and binds it to
/// `<name>@@<version>`.
macro_rules! export {
    ($(
        $(#[$doc:meta])*
        $ver:literal fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block
    )*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        ///
        /// The libibverbs contract of this verb: pointers are null or valid for what the verb
        /// reads and writes.
        #[unsafe(export_name = concat!("softnic_", stringify!($name)))]
        pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? $body
        std::arch::global_asm!(concat!(
            ".symver softnic_", stringify!($name), ", ", stringify!($name), "@@", $ver
        ));
    )*};
}
