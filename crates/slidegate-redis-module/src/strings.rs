//! Redis module strings, read as bytes without a copy.

use redis_module::raw;

/// The bytes of a module string, borrowed for as long as Redis keeps it.
#[allow(unsafe_code)]
pub fn string_bytes<'a>(s: *mut raw::RedisModuleString) -> &'a [u8] {
    let mut len = 0;
    // SAFETY: `s` is an argument of the running command, alive until it
    // returns; StringPtrLen neither copies nor allocates.
    unsafe {
        let ptr = raw::RedisModule_StringPtrLen.map_or(std::ptr::null(), |f| f(s, &mut len));
        if ptr.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(ptr.cast::<u8>(), len)
        }
    }
}
