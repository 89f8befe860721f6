// TEMPORARY stub until webgraph_gen.rs lands.
#[derive(Debug, Clone, PartialEq)]
pub struct WebGraphSpec {
    pub nodes: u64,
    pub arcs: u64,
}
impl WebGraphSpec {
    pub fn from_preset(_n: &str, _s: f64) -> Result<Self, String> {
        Err("stub".into())
    }
}
pub struct HostLayout;
impl HostLayout {
    pub fn new(_s: &WebGraphSpec, _seed: u64) -> Self {
        HostLayout
    }
}
pub fn generate_rows(
    _s: &WebGraphSpec,
    _l: &HostLayout,
    _seed: u64,
    _lo: u64,
    _hi: u64,
) -> (Vec<u64>, Vec<u32>) {
    unimplemented!()
}
