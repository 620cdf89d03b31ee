//! `mock-provider`: the mock model provider of crates/mock-provider, as a binary of this package
//! so the integration tests and the benchmark scripts find it beside `gateway`.

fn main() {
    gateway_mock_provider::main();
}
