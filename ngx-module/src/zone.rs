//! The `yarl_zone` shared-memory zone: this nginx's one limiter, for every worker.
//!
//! Added in postconfiguration as zone "yarl" with the module as its tag, so nginx keeps it
//! across `nginx -s reload` when the size is unchanged (as it keeps `limit_req_zone`s) and
//! calls [`zone_init`] with the old zone's data. The whole usable part of the zone (every
//! page of its slab pool) is one block of `yarl-core`'s layout: header, roots, index,
//! slots, names. `yarl_core::zone::prepare` formats it when new, keeps it when reused (and
//! bumps its generation so a sync agent of the old configuration hands over), and formats
//! it again, with a notice, when it holds another layout (a different module build).

use crate::conf::MainConf;
use core::ffi::c_void;
use core::ptr::{addr_of_mut, NonNull};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use ngx::core::Status;
use ngx::ffi::{
    ngx_conf_t, ngx_int_t, ngx_pagesize_shift, ngx_shared_memory_add, ngx_shm_zone_t,
    ngx_slab_alloc_locked, ngx_slab_pool_t, NGX_LOG_EMERG, NGX_LOG_INFO, NGX_LOG_NOTICE,
};
use ngx::{ngx_log_error, ngx_string};
use std::panic::{catch_unwind, AssertUnwindSafe};
use yarl_core::{Block, Prepared, ZoneError};

/// The key table size of the configuration being read (`yarl_zone ... keys=`), for the
/// zone's init callback, which nginx calls in the master right after it (and gives no
/// configuration).
static ZONE_KEYS: AtomicU32 = AtomicU32::new(0);

/// Adds the zone to the configuration being read; called once the `http` block is parsed.
///
/// # Safety
/// `cf` must be the `ngx_conf_t` of postconfiguration.
pub(crate) unsafe fn add(cf: *mut ngx_conf_t, mc: &mut MainConf) -> Result<(), String> {
    let mut name = ngx_string!("yarl");
    // SAFETY: `cf` is valid per the caller; the module's address tags the zone, so only this
    // module (loaded at this address) reuses it on reload.
    let zone = unsafe {
        ngx_shared_memory_add(
            cf,
            &mut name,
            mc.zone_size(),
            addr_of_mut!(crate::ngx_http_yarl_module).cast(),
        )
    };
    let mut zone = NonNull::new(zone).ok_or("cannot add the shared memory zone \"yarl\"")?;
    // SAFETY: nginx returned a zone entry of this cycle; nothing else writes its init.
    let z = unsafe { zone.as_mut() };
    z.init = Some(zone_init);
    z.data = core::ptr::null_mut();
    mc.shm_zone = Some(zone);
    ZONE_KEYS.store(mc.zone_keys(), Relaxed);
    Ok(())
}

/// The zone's block: the pages of its slab pool.
///
/// # Safety
/// `zone` must be an initialized shared zone of this module (after `ngx_init_zone_pool`),
/// in the master between its init and the next reload, or in a worker of its cycle.
pub(crate) unsafe fn block(zone: &ngx_shm_zone_t) -> Option<Block> {
    let pool = zone.shm.addr.cast::<ngx_slab_pool_t>();
    if pool.is_null() {
        return None;
    }
    // SAFETY: per the caller the zone starts with nginx's slab pool header; its page table
    // (`pages` .. `last`) describes the pages from `start`, page-aligned, all inside the zone.
    unsafe {
        let pages = (*pool).last.offset_from((*pool).pages);
        let start = (*pool).start;
        let bytes = usize::try_from(pages).ok()? << ngx_pagesize_shift;
        if start.is_null() || bytes < 8 || start.align_offset(8) != 0 {
            return None;
        }
        // The zone stays mapped at this address for the life of every process that uses it
        // (workers inherit the mapping; the master keeps it until the cycle is freed), and
        // every access through the slice is atomic.
        let words: &'static [AtomicU64] =
            core::slice::from_raw_parts(start.cast::<AtomicU64>(), bytes / 8);
        Some(Block::borrowed(words))
    }
}

/// nginx's init callback for the zone: `data` is the old cycle's zone data on reload.
unsafe extern "C" fn zone_init(zone: *mut ngx_shm_zone_t, data: *mut c_void) -> ngx_int_t {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: nginx calls init with its zone entry, initialized (ngx_init_zone_pool ran,
        // or the old zone's memory is reused).
        let z = unsafe { &mut *zone };
        let log = z.shm.log;
        // SAFETY: as above.
        let Some(block) = (unsafe { block(z) }) else {
            ngx_log_error!(NGX_LOG_EMERG, log, "yarl: the shared memory zone \"yarl\" is unusable");
            return Status::NGX_ERROR;
        };
        if data.is_null() {
            advise_huge_pages(&block);
            // A new zone: take every page from the slab allocator, so nothing else that might
            // allocate from this pool writes into the block.
            let pool = z.shm.addr.cast::<ngx_slab_pool_t>();
            // SAFETY: the pool was just initialized by nginx and no worker runs yet.
            let p = unsafe { ngx_slab_alloc_locked(pool, block.bytes()) };
            if p.is_null() || p.cast::<u8>() != block.words().as_ptr().cast::<u8>().cast_mut() {
                ngx_log_error!(
                    NGX_LOG_EMERG,
                    log,
                    "yarl: cannot allocate the shared memory zone \"yarl\""
                );
                return Status::NGX_ERROR;
            }
        }
        z.data = block.words().as_ptr().cast_mut().cast();
        let keys = ZONE_KEYS.load(Relaxed);
        let capacity = yarl_core::zone::quotas_for_bytes(block.bytes(), keys).unwrap_or(0);
        // On reload (`data` set) the running workers keep using this memory until their
        // requests end: it may be reused, never formatted again under them.
        let prepared = match data.is_null() {
            true => yarl_core::zone::prepare(&block, keys),
            false => yarl_core::zone::prepare_reused(&block, keys),
        };
        match prepared {
            Ok(Prepared::Formatted) => {
                ngx_log_error!(
                    NGX_LOG_INFO,
                    log,
                    "yarl: zone \"yarl\" of {} bytes holds up to {} quotas and {} keys",
                    z.shm.size,
                    capacity,
                    keys
                );
                Status::NGX_OK
            }
            Ok(Prepared::Reused) => Status::NGX_OK,
            Ok(Prepared::Reformatted(why)) => {
                ngx_log_error!(
                    NGX_LOG_NOTICE,
                    log,
                    "yarl: zone \"yarl\" started empty ({}); quotas are fetched again",
                    why
                );
                Status::NGX_OK
            }
            Err(e @ ZoneError::InUse(_)) => {
                ngx_log_error!(
                    NGX_LOG_EMERG,
                    log,
                    "yarl_zone: zone \"yarl\" cannot change on reload: {}; restart nginx \
                     to apply it, or change the zone's size too (a zone of another size is \
                     a new zone, which starts empty)",
                    e
                );
                Status::NGX_ERROR
            }
            Err(e) => {
                ngx_log_error!(NGX_LOG_EMERG, log, "yarl: zone \"yarl\": {}", e);
                Status::NGX_ERROR
            }
        }
    }));
    match r {
        Ok(s) => s.0,
        Err(_) => Status::NGX_ERROR.0,
    }
}

/// Asks for transparent huge pages on the block: a decision touches a few of a million
/// slots at random, and 2 MiB pages turn most of the TLB misses that costs into hits. Linux
/// honours it for shared memory when `/sys/kernel/mm/transparent_hugepage/shmem_enabled`
/// is `advise` (or `always`); elsewhere it is a no-op.
fn advise_huge_pages(block: &Block) {
    const HUGE: usize = 2 << 20;
    let start = block.words().as_ptr() as usize;
    let end = start + block.bytes();
    let from = start.next_multiple_of(HUGE);
    let to = end / HUGE * HUGE;
    if to > from {
        // SAFETY: the range lies inside the zone's mapping; MADV_HUGEPAGE changes no content.
        unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_HUGEPAGE) };
    }
}

/// The zone of the running cycle's configuration, for a worker.
pub(crate) fn of(mc: &MainConf) -> Option<Block> {
    let zone = mc.shm_zone?;
    // SAFETY: called in a worker (or single process) of the cycle that added the zone; the
    // master initialized it before forking.
    unsafe { block(zone.as_ref()) }
}
