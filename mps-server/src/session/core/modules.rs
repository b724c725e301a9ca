//! Modules: the image uploaded chunk by chunk through the staging area, and the kernels found
//! in it.

use std::sync::Arc;

use mps_core::handle::{Handle, HandleKind};
use mps_core::protocol::{
    COMPLETION_DATA_BYTES, Completion, OccupancyQuery, PARAMS_PER_REPLY, ParamInfo,
};
use mps_core::ptx::ImageFormat;
use mps_core::{Error, Result};

use super::{Answer, DONE, SessionCore};
use crate::backend::Backend;
use crate::session::limits::exceeded;
use crate::session::tables::{FunctionEntry, ensure_room};

impl<B: Backend> SessionCore<B> {
    pub(super) fn module_data(&mut self, offset: u64, len: u64, last: bool) -> Result<Answer> {
        let result = self.take_module_chunk(offset, len, last);
        if result.is_err() {
            // An upload that failed is abandoned: its memory goes back at once.
            self.pending_image = Vec::new();
        }
        result
    }

    pub(super) fn take_module_chunk(
        &mut self,
        offset: u64,
        len: u64,
        last: bool,
    ) -> Result<Answer> {
        let (staging, staging_len) = self.channel.staging();
        if offset
            .checked_add(len)
            .is_none_or(|e| e > staging_len as u64)
        {
            return Err(Error::invalid_value(format!(
                "module data {offset}+{len} runs past the {staging_len}-byte staging area"
            )));
        }
        let max = self.limits.max_module_bytes;
        let at = self.pending_image.len();
        if at as u64 + len > max {
            return Err(exceeded(
                "max_module_bytes",
                format!("a module image of more than {max} bytes"),
            ));
        }
        self.pending_image.resize(at + len as usize, 0);
        // SAFETY: offset + len lies inside the staging area (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(
                staging.add(offset as usize),
                self.pending_image[at..].as_mut_ptr(),
                len as usize,
            )
        };
        if !last {
            return DONE;
        }
        let image = std::mem::take(&mut self.pending_image);
        ensure_room(
            &self.modules,
            HandleKind::Module,
            "max_modules",
            self.limits.max_modules,
        )?;
        // A fatbin's uncompressed PTX parts are counted the same way in its bytes (its
        // compressed ones are counted by the backend as it reads them).
        if matches!(
            ImageFormat::detect(&image)?,
            ImageFormat::Ptx | ImageFormat::Fatbin
        ) {
            let most = self.limits.max_module_entries;
            let entries = count_entries(&image, most);
            if entries > most {
                return Err(exceeded(
                    "max_module_entries",
                    format!("a PTX module of more than {most} kernel entries"),
                ));
            }
        }
        let module = self.backend.module_load(&image)?;
        let h = self.handles.next(HandleKind::Module);
        self.modules.insert(h, Arc::new(module))?;
        Ok(Answer::Values([h.0, 0, 0, 0]))
    }

    pub(super) fn module_unload(&mut self, module: u64) -> Result<Answer> {
        self.modules.remove(module)?;
        self.function_names.remove(&module);
        for ptr in self.globals.remove(&module).unwrap_or_default() {
            self.untable_mapping(ptr);
        }
        let kernels: Vec<u64> = self
            .functions
            .iter()
            .filter(|(_, f)| f.module == Handle(module))
            .map(|(h, _)| h.0)
            .collect();
        self.batch.forget_functions(&kernels);
        self.batch_cache_changed();
        self.functions.retain(|f| f.module != Handle(module));
        DONE
    }

    pub(super) fn get_function(&mut self, module: u64, name: &[u8]) -> Result<Answer> {
        let m = self.modules.get(module)?.clone();
        let name = std::str::from_utf8(name)
            .map_err(|_| Error::invalid_value("kernel name is not UTF-8"))?;
        ensure_room(
            &self.functions,
            HandleKind::Function,
            "max_functions",
            self.limits.max_functions,
        )?;
        let (function, params) = self.backend.module_function(&m, name)?;
        let h = self.handles.next(HandleKind::Function);
        let param_bytes = params.last().map_or(0, |p| (p.offset + p.size) as usize);
        let count = params.len() as u64;
        let entry = FunctionEntry {
            module: Handle(module),
            function: Arc::new(function),
            params,
            param_bytes,
        };
        self.functions.insert(h, entry)?;
        Ok(Answer::Values([h.0, count, param_bytes as u64, 0]))
    }

    /// A module global's address and size. Kernels may be given the address, and copies and
    /// memsets may name it (cuFFT copies its tables into its module's globals): its range is
    /// the client's, as a mapping, until the module is unloaded.
    pub(super) fn module_global(&mut self, module: u64, name: &[u8]) -> Result<Answer> {
        let m = self.modules.get(module)?.clone();
        let name = std::str::from_utf8(name)
            .map_err(|_| Error::invalid_value("global name is not UTF-8"))?;
        let (ptr, size) = self.backend.module_global(&m, name)?;
        if let Err(e) = self.table_global(module, ptr, size) {
            // The address is still the global's, for kernels: only copies cannot name it.
            tracing::warn!(
                global = name,
                "a module global stays out of the client's ranges: {e}"
            );
        }
        Ok(Answer::Values([ptr, size, 0, 0]))
    }

    /// Adds global `[ptr, ptr + size)` of `module` to the client's ranges, once.
    fn table_global(&mut self, module: u64, ptr: u64, size: u64) -> Result<()> {
        if size == 0 || self.allocations.is_mapped(ptr) {
            return Ok(());
        }
        self.table_mapping(ptr, size)?;
        self.globals.entry(module).or_default().push(ptr);
        Ok(())
    }

    /// A page of the names of a module's kernels, from byte `offset` of their concatenation
    /// (each name followed by a NUL), with their length and count.
    pub(super) fn module_function_names(
        &mut self,
        seq: u64,
        module: u64,
        offset: u64,
    ) -> Result<Answer> {
        let m = self.modules.get(module)?.clone();
        let (count, names) = match self.function_names.get(&module) {
            Some(known) => known.clone(),
            None => {
                let list = self.backend.module_function_names(&m)?;
                let mut bytes = Vec::new();
                for name in &list {
                    bytes.extend_from_slice(name.as_bytes());
                    bytes.push(0);
                }
                let known = (list.len() as u64, Arc::<[u8]>::from(bytes));
                self.function_names.insert(module, known.clone());
                known
            }
        };
        let start = usize::try_from(offset)
            .ok()
            .filter(|o| *o <= names.len())
            .ok_or_else(|| {
                Error::invalid_value(format!(
                    "offset {offset} lies past the {} bytes of the module's kernel names",
                    names.len()
                ))
            })?;
        let page = &names[start..names.len().min(start + COMPLETION_DATA_BYTES)];
        let mut c = Completion::reply(seq, [names.len() as u64, count, 0, 0]);
        c.data[..page.len()].copy_from_slice(page);
        c.data_len = page.len() as u32;
        Ok(Answer::Full(Box::new(c)))
    }

    pub(super) fn param_info(&self, seq: u64, function: u64, first: u32) -> Result<Answer> {
        let f = self.functions.get(function)?;
        let rest = f.params.get(first as usize..).unwrap_or(&[]);
        let page = &rest[..rest.len().min(PARAMS_PER_REPLY)];
        let mut c = Completion::reply(seq, [page.len() as u64, 0, 0, 0]);
        let bytes = bytemuck::cast_slice::<ParamInfo, u8>(page);
        c.data[..bytes.len()].copy_from_slice(bytes);
        c.data_len = bytes.len() as u32;
        Ok(Answer::Full(Box::new(c)))
    }
}

impl<B: Backend> SessionCore<B> {
    /// The context's priority range and limits, as [`Request::ContextLimits`] lays them out.
    ///
    /// [`Request::ContextLimits`]: mps_core::protocol::Request::ContextLimits
    pub(super) fn context_limits(&self, seq: u64) -> Answer {
        let ((least, greatest), limits) = self.backend.context_limits();
        let mask = mask(limits.iter().map(Option::is_some));
        let mut c = Completion::reply(seq, [least as u32 as u64, greatest as u32 as u64, mask, 0]);
        let bytes: Vec<u8> = limits
            .iter()
            .flat_map(|v| v.unwrap_or(0).to_le_bytes())
            .collect();
        c.data[..bytes.len()].copy_from_slice(&bytes);
        c.data_len = bytes.len() as u32;
        Answer::Full(Box::new(c))
    }

    /// A kernel's attributes, as [`Request::FuncAttributes`] lays them out.
    ///
    /// [`Request::FuncAttributes`]: mps_core::protocol::Request::FuncAttributes
    pub(super) fn func_attributes(&self, seq: u64, function: u64) -> Result<Answer> {
        let f = self.functions.get(function)?;
        let attrs = self.backend.function_attributes(&f.function)?;
        let mask = mask(attrs.iter().map(Option::is_some));
        let mut c = Completion::reply(seq, [attrs.len() as u64, mask, 0, 0]);
        let bytes: Vec<u8> = attrs
            .iter()
            .flat_map(|v| v.unwrap_or(0).to_le_bytes())
            .collect();
        c.data[..bytes.len()].copy_from_slice(&bytes);
        c.data_len = bytes.len() as u32;
        Ok(Answer::Full(Box::new(c)))
    }

    pub(super) fn occupancy(&self, function: u64, query: OccupancyQuery) -> Result<Answer> {
        let f = self.functions.get(function)?;
        let figure = self.backend.occupancy(&f.function, query)?;
        Ok(Answer::Values([figure, 0, 0, 0]))
    }
}

/// Bit n set where the nth flag is.
fn mask(flags: impl Iterator<Item = bool>) -> u64 {
    flags
        .enumerate()
        .fold(0, |m, (i, set)| m | (set as u64) << i)
}

/// `.entry` directives in a PTX image, counted up to one past `most`.
fn count_entries(image: &[u8], most: usize) -> usize {
    const ENTRY: &[u8] = b".entry";
    let mut count = 0;
    let mut rest = image;
    while count <= most {
        match rest.iter().position(|b| *b == b'.') {
            Some(i) => {
                if rest[i..].starts_with(ENTRY) {
                    count += 1;
                }
                rest = &rest[i + 1..];
            }
            None => break,
        }
    }
    count
}
