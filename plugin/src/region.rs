//! The accounting region mapped shared (the plugin's one `unsafe` module).
