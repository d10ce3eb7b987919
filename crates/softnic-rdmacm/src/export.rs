//! The `export!` macro: a C function of the library, bound to its librdmacm symbol version.

/// Defines each function with the C ABI, exported as `softnic_<name>` bound to
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
        /// The librdmacm contract of this call: pointers are null or valid for what it reads
        /// and writes, and objects are ones this library handed out.
        pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? $body
        // The exported symbol is a wrapper nothing in the crate calls: the assembler then
        // finds it beside its `.symver` (a function the crate also calls may be emitted in
        // another codegen unit than the directive, which the assembler refuses).
        const _: () = {
            /// The exported symbol of the function above.
            ///
            /// # Safety
            ///
            /// As the function's.
            #[unsafe(export_name = concat!("softnic_", stringify!($name)))]
            unsafe extern "C" fn exported($($arg: $ty),*) $(-> $ret)? {
                // SAFETY: the caller's contract, passed on.
                unsafe { $name($($arg),*) }
            }
        };
        std::arch::global_asm!(concat!(
            ".symver softnic_", stringify!($name), ", ", stringify!($name), "@@", $ver
        ));
    )*};
}
