// `sqlx::migrate!` embeds the migration folders at compile time: a new file must rebuild
// the crate even when no Rust source changed.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
