//! The ROCm code-object manager (`libamd_comgr`), loaded at run time: reads an AMD code object's
//! (hsaco's) own metadata, the way the HIP runtime does before a launch. Used by the code-object
//! checks and by the recording HIP double to lay out kernel arguments as HIP would.
use std::ffi::{CString, c_char};

use libloading::Library;

/// Library names tried in order (Debian 12 ships `libamd-comgr2`).
const LIBRARY_NAMES: [&str; 4] = ["libamd_comgr.so.2", "libamd_comgr.so.3", "libamd_comgr.so", "/opt/rocm/lib/libamd_comgr.so"];

const STATUS_SUCCESS: i32 = 0;
const DATA_KIND_EXECUTABLE: i32 = 0x8;
const METADATA_KIND_STRING: i32 = 0x1;

#[repr(C)]
#[derive(Clone, Copy)]
struct Handle {
    handle: u64,
}

type Status = i32;

/// One explicit or hidden kernel argument as the code object describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arg {
    /// `.name` (Triton writes none for most arguments: empty then).
    pub name: String,
    pub offset: u32,
    pub size: u32,
    /// `.value_kind`: `global_buffer`, `by_value`, `hidden_*`, ...
    pub value_kind: String,
}

impl Arg {
    pub fn is_hidden(&self) -> bool {
        self.value_kind.starts_with("hidden_")
    }
}

/// What the code object says of one kernel (`amdhsa.kernels[i]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// `.name`
    pub name: String,
    /// `.symbol` (the kernel descriptor, `<name>.kd`)
    pub symbol: String,
    pub kernarg_segment_size: u32,
    pub kernarg_segment_align: u32,
    /// Static LDS (Triton's LDS is dynamic: passed at launch).
    pub group_segment_fixed_size: u32,
    /// Scratch per work-item: spills and private arrays.
    pub private_segment_fixed_size: u32,
    pub wavefront_size: u32,
    pub sgpr_count: u32,
    pub vgpr_count: u32,
    /// `.agpr_count` (gfx90a+), 0 when absent.
    pub agpr_count: u32,
    pub sgpr_spill_count: u32,
    pub vgpr_spill_count: u32,
    pub max_flat_workgroup_size: u32,
    pub args: Vec<Arg>,
}

/// A code object's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeObject {
    /// The ISA name comgr reports, e.g. `amdgcn-amd-amdhsa--gfx90a`, or `None` where this
    /// comgr does not know the processor (ROCm 5.2's predates gfx942 and gfx950).
    pub isa: Option<String>,
    pub kernels: Vec<Kernel>,
}

/// The loaded library and the entry points used.
pub struct Comgr {
    path: String,
    create_data: unsafe extern "C" fn(i32, *mut Handle) -> Status,
    set_data: unsafe extern "C" fn(Handle, usize, *const c_char) -> Status,
    release_data: unsafe extern "C" fn(Handle) -> Status,
    get_data_isa_name: unsafe extern "C" fn(Handle, *mut usize, *mut c_char) -> Status,
    get_data_metadata: unsafe extern "C" fn(Handle, *mut Handle) -> Status,
    destroy_metadata: unsafe extern "C" fn(Handle) -> Status,
    get_metadata_kind: unsafe extern "C" fn(Handle, *mut i32) -> Status,
    get_metadata_string: unsafe extern "C" fn(Handle, *mut usize, *mut c_char) -> Status,
    metadata_lookup: unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> Status,
    get_metadata_list_size: unsafe extern "C" fn(Handle, *mut usize) -> Status,
    index_list_metadata: unsafe extern "C" fn(Handle, usize, *mut Handle) -> Status,
    _library: Library,
}

/// A metadata node, destroyed on drop.
struct Node<'a> {
    comgr: &'a Comgr,
    handle: Handle,
}

impl Drop for Node<'_> {
    fn drop(&mut self) {
        // SAFETY: a node handle comgr gave out, destroyed once.
        unsafe { (self.comgr.destroy_metadata)(self.handle) };
    }
}

impl Comgr {
    /// Opens the library, or says which names were tried.
    pub fn load() -> Result<Comgr, String> {
        let mut last = String::new();
        for name in LIBRARY_NAMES {
            // SAFETY: loading the code-object manager runs only its initialisers.
            let library = match unsafe { Library::new(name) } {
                Ok(library) => library,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            macro_rules! symbol {
                ($name:literal) => {
                    // SAFETY: the type is comgr's declaration of the entry point (amd_comgr.h).
                    *unsafe { library.get(concat!($name, "\0").as_bytes()) }.map_err(|e| format!("{name}: {e}"))?
                };
            }
            return Ok(Comgr {
                path: name.to_string(),
                create_data: symbol!("amd_comgr_create_data"),
                set_data: symbol!("amd_comgr_set_data"),
                release_data: symbol!("amd_comgr_release_data"),
                get_data_isa_name: symbol!("amd_comgr_get_data_isa_name"),
                get_data_metadata: symbol!("amd_comgr_get_data_metadata"),
                destroy_metadata: symbol!("amd_comgr_destroy_metadata"),
                get_metadata_kind: symbol!("amd_comgr_get_metadata_kind"),
                get_metadata_string: symbol!("amd_comgr_get_metadata_string"),
                metadata_lookup: symbol!("amd_comgr_metadata_lookup"),
                get_metadata_list_size: symbol!("amd_comgr_get_metadata_list_size"),
                index_list_metadata: symbol!("amd_comgr_index_list_metadata"),
                _library: library,
            });
        }
        Err(format!("the ROCm code-object manager was not found (tried {}): {last}", LIBRARY_NAMES.join(", ")))
    }

    /// The file the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn check(&self, status: Status, what: &str) -> Result<(), String> {
        if status == STATUS_SUCCESS { Ok(()) } else { Err(format!("{what} failed: comgr status {status}")) }
    }

    /// Reads the metadata of an executable code object (an hsaco).
    pub fn read(&self, image: &[u8]) -> Result<CodeObject, String> {
        let mut data = Handle { handle: 0 };
        // SAFETY: out-pointer valid; the data handle is released below on every path.
        self.check(unsafe { (self.create_data)(DATA_KIND_EXECUTABLE, &mut data) }, "amd_comgr_create_data")?;
        let result = self.read_data(data, image);
        // SAFETY: the handle created above.
        unsafe { (self.release_data)(data) };
        result
    }

    fn read_data(&self, data: Handle, image: &[u8]) -> Result<CodeObject, String> {
        // SAFETY: comgr copies `image` (size and pointer of a live slice).
        self.check(unsafe { (self.set_data)(data, image.len(), image.as_ptr().cast()) }, "amd_comgr_set_data")?;
        let mut size = 0usize;
        // SAFETY: size query first, then a buffer of that size.
        let isa = if unsafe { (self.get_data_isa_name)(data, &mut size, std::ptr::null_mut()) } == STATUS_SUCCESS {
            let mut isa = vec![0u8; size];
            self.check(unsafe { (self.get_data_isa_name)(data, &mut size, isa.as_mut_ptr().cast()) }, "amd_comgr_get_data_isa_name")?;
            Some(String::from_utf8_lossy(&isa).trim_end_matches('\0').to_string())
        } else {
            None
        };
        let mut root = Handle { handle: 0 };
        // SAFETY: valid data handle and out-pointer.
        self.check(unsafe { (self.get_data_metadata)(data, &mut root) }, "amd_comgr_get_data_metadata")?;
        let root = Node { comgr: self, handle: root };
        let kernels_node = self.lookup(&root, "amdhsa.kernels")?;
        let mut kernels = Vec::new();
        for i in 0..self.list_size(&kernels_node)? {
            let k = self.index(&kernels_node, i)?;
            let args_node = self.lookup(&k, ".args")?;
            let mut args = Vec::new();
            for j in 0..self.list_size(&args_node)? {
                let a = self.index(&args_node, j)?;
                args.push(Arg {
                    name: self.optional_string(&a, ".name")?.unwrap_or_default(),
                    offset: self.number(&a, ".offset")?,
                    size: self.number(&a, ".size")?,
                    value_kind: self.string(&a, ".value_kind")?,
                });
            }
            let optional = |key: &str| -> Result<u32, String> {
                self.optional_string(&k, key)?.map_or(Ok(0), |v| v.parse().map_err(|e| format!("{key} {v:?}: {e}")))
            };
            kernels.push(Kernel {
                name: self.string(&k, ".name")?,
                symbol: self.string(&k, ".symbol")?,
                kernarg_segment_size: self.number(&k, ".kernarg_segment_size")?,
                kernarg_segment_align: self.number(&k, ".kernarg_segment_align")?,
                group_segment_fixed_size: self.number(&k, ".group_segment_fixed_size")?,
                private_segment_fixed_size: self.number(&k, ".private_segment_fixed_size")?,
                wavefront_size: self.number(&k, ".wavefront_size")?,
                sgpr_count: self.number(&k, ".sgpr_count")?,
                vgpr_count: self.number(&k, ".vgpr_count")?,
                agpr_count: optional(".agpr_count")?,
                sgpr_spill_count: optional(".sgpr_spill_count")?,
                vgpr_spill_count: optional(".vgpr_spill_count")?,
                max_flat_workgroup_size: optional(".max_flat_workgroup_size")?,
                args,
            });
        }
        Ok(CodeObject { isa, kernels })
    }

    fn lookup<'a>(&'a self, node: &Node, key: &str) -> Result<Node<'a>, String> {
        self.try_lookup(node, key)?.ok_or_else(|| format!("metadata has no {key}"))
    }

    fn try_lookup<'a>(&'a self, node: &Node, key: &str) -> Result<Option<Node<'a>>, String> {
        let key_c = CString::new(key).map_err(|e| e.to_string())?;
        let mut value = Handle { handle: 0 };
        // SAFETY: valid node, NUL-terminated key, out-pointer.
        let status = unsafe { (self.metadata_lookup)(node.handle, key_c.as_ptr(), &mut value) };
        Ok((status == STATUS_SUCCESS).then_some(Node { comgr: self, handle: value }))
    }

    fn list_size(&self, node: &Node) -> Result<usize, String> {
        let mut size = 0;
        // SAFETY: valid node and out-pointer.
        self.check(unsafe { (self.get_metadata_list_size)(node.handle, &mut size) }, "amd_comgr_get_metadata_list_size")?;
        Ok(size)
    }

    fn index<'a>(&'a self, node: &Node, i: usize) -> Result<Node<'a>, String> {
        let mut value = Handle { handle: 0 };
        // SAFETY: valid node, index below the list size, out-pointer.
        self.check(unsafe { (self.index_list_metadata)(node.handle, i, &mut value) }, "amd_comgr_index_list_metadata")?;
        Ok(Node { comgr: self, handle: value })
    }

    fn node_string(&self, node: &Node) -> Result<String, String> {
        let mut kind = 0;
        // SAFETY: valid node and out-pointer.
        self.check(unsafe { (self.get_metadata_kind)(node.handle, &mut kind) }, "amd_comgr_get_metadata_kind")?;
        if kind != METADATA_KIND_STRING {
            return Err(format!("metadata node of kind {kind} is not a string"));
        }
        let mut size = 0usize;
        // SAFETY: size query, then a buffer of that size (it counts the NUL).
        self.check(unsafe { (self.get_metadata_string)(node.handle, &mut size, std::ptr::null_mut()) }, "amd_comgr_get_metadata_string")?;
        let mut text = vec![0u8; size];
        self.check(unsafe { (self.get_metadata_string)(node.handle, &mut size, text.as_mut_ptr().cast()) }, "amd_comgr_get_metadata_string")?;
        Ok(String::from_utf8_lossy(&text).trim_end_matches('\0').to_string())
    }

    fn string(&self, node: &Node, key: &str) -> Result<String, String> {
        self.node_string(&self.lookup(node, key)?).map_err(|e| format!("{key}: {e}"))
    }

    fn optional_string(&self, node: &Node, key: &str) -> Result<Option<String>, String> {
        match self.try_lookup(node, key)? {
            Some(value) => self.node_string(&value).map(Some).map_err(|e| format!("{key}: {e}")),
            None => Ok(None),
        }
    }

    fn number(&self, node: &Node, key: &str) -> Result<u32, String> {
        let text = self.string(node, key)?;
        text.parse().map_err(|e| format!("{key} {text:?}: {e}"))
    }
}
