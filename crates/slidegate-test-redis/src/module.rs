//! The native module (`crates/slidegate-redis-module`) for servers and
//! clusters that load it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The shared library `cargo build -p slidegate-redis-module` makes.
const LIB: &str = "libslidegate_redis_module.so";

/// The module's shared library: `SLIDEGATE_REDIS_MODULE` when set, else the
/// one in the running test's target directory (`cargo build -p
/// slidegate-redis-module` puts it there; `.ci/run` does before the tests).
/// When that is missing it is built once per test binary into a target
/// directory of its own, `<target>/module-test` (the running `cargo test`
/// holds the lock of the main one).
///
/// # Panics
/// If the build fails, or the test does not run from `<target>/<profile>/deps`.
pub fn slidegate_module() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        if let Some(path) = std::env::var_os("SLIDEGATE_REDIS_MODULE") {
            return PathBuf::from(path);
        }
        // <target>/<profile>/deps/<this test>
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test's own path: {e}"));
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .unwrap_or_else(|| panic!("a test runs from <target>/<profile>/deps, not {}", exe.display()));
        let built = profile_dir.join(LIB);
        if built.exists() {
            return built;
        }
        let target = profile_dir.parent().unwrap_or(profile_dir).join("module-test");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = Command::new(cargo)
            .args(["build", "-p", "slidegate-redis-module", "--target-dir"])
            .arg(&target)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap_or_else(|e| panic!("cannot run cargo build -p slidegate-redis-module: {e}"));
        assert!(status.success(), "cargo build -p slidegate-redis-module failed");
        target.join("debug").join(LIB)
    })
}

/// `redis-server` arguments that load the module and enable the `MODULE`
/// command (tests unload it to see a server without).
pub fn module_args() -> [String; 4] {
    let path = slidegate_module().to_str().unwrap_or_else(|| panic!("a UTF-8 module path")).to_owned();
    ["--loadmodule".into(), path, "--enable-module-command".into(), "yes".into()]
}
