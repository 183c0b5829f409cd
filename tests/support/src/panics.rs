//! [`quiet_panics`]: the panics a test injects on purpose print nothing.

use std::sync::Once;

/// Installs, once per test binary, a panic hook that stays silent for panics whose message starts with
/// `injected` (a faulty clock, waker or callback a test plants) and prints every other panic as the default
/// hook does, so that a real failure is never hidden.
pub fn quiet_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let injected = info.payload().downcast_ref::<&str>().is_some_and(|m| m.starts_with("injected"));
            if !injected {
                default(info);
            }
        }));
    });
}
