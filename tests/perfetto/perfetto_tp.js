#!/usr/bin/env node
// SPDX-License-Identifier: Apache-2.0
//
// Loads a trace file into Perfetto's trace processor -- the WebAssembly build
// that the Perfetto UI itself runs (engine_bundle.js + trace_processor.wasm of
// a packaged Perfetto UI) -- through the same RPC the UI speaks, then runs SQL
// queries against it and prints one JSON object:
//
//   {"perfetto_version": "...", "load_error": null | "...",
//    "results": [{"sql": "...", "columns": [...], "rows": [[...], ...],
//                 "error": null | "..."}, ...]}
//
// usage: perfetto_tp.js UI_DIR TRACE_FILE SQL...
//
// Exit status: 0 when the trace loaded and every query ran, 1 when the load or
// a query failed (the JSON still says which), 2 for bad usage or a UI
// directory without the engine.
'use strict';

const fs = require('fs');
const path = require('path');
const vm = require('vm');

// ---- protobuf wire format: just what the RPC needs -------------------------

const WT_VARINT = 0, WT_I64 = 1, WT_LEN = 2;

function varint(n) {
    const out = [];
    let v = BigInt(n);
    if (v < 0n) v += 1n << 64n;
    do {
        let b = Number(v & 0x7fn);
        v >>= 7n;
        if (v !== 0n) b |= 0x80;
        out.push(b);
    } while (v !== 0n);
    return Buffer.from(out);
}

function tag(field, wt) { return varint((field << 3) | wt); }

function lenField(field, bytes) {
    return Buffer.concat([tag(field, WT_LEN), varint(bytes.length), bytes]);
}

function varintField(field, n) { return Buffer.concat([tag(field, WT_VARINT), varint(n)]); }

class Reader {
    constructor(buf) { this.buf = buf; this.pos = 0; }
    done() { return this.pos >= this.buf.length; }
    varint() {
        let v = 0n, shift = 0n;
        for (;;) {
            if (this.pos >= this.buf.length) throw new Error('truncated varint');
            const b = this.buf[this.pos++];
            v |= BigInt(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
            shift += 7n;
        }
    }
    bytes() {
        const n = Number(this.varint());
        if (this.pos + n > this.buf.length) throw new Error('truncated field');
        const b = this.buf.subarray(this.pos, this.pos + n);
        this.pos += n;
        return b;
    }
    // Calls fn(field, wiretype) for each field; fn consumes the value or
    // returns false to have it skipped.
    fields(fn) {
        while (!this.done()) {
            const t = Number(this.varint());
            const field = t >>> 3, wt = t & 7;
            if (fn(field, wt) !== false) continue;
            if (wt === WT_VARINT) this.varint();
            else if (wt === WT_I64) this.pos += 8;
            else if (wt === WT_LEN) this.bytes();
            else if (wt === 5) this.pos += 4;
            else throw new Error(`unsupported wire type ${wt}`);
        }
    }
}

function signed64(v) { return v >= (1n << 63n) ? v - (1n << 64n) : v; }

function packedVarints(bytes) {
    const r = new Reader(bytes), out = [];
    while (!r.done()) out.push(r.varint());
    return out;
}

// ---- the trace processor RPC (perfetto.protos.TraceProcessorRpc) -----------

const TPM_APPEND_TRACE_DATA = 1;
const TPM_FINALIZE_TRACE_DATA = 2;
const TPM_QUERY_STREAMING = 3;
const CELL_NULL = 1, CELL_VARINT = 2, CELL_FLOAT64 = 3, CELL_STRING = 4, CELL_BLOB = 5;

function decodeBatch(bytes, q) {
    const r = new Reader(bytes);
    const batch = {cells: [], varints: [], doubles: [], strings: [], blobs: 0, last: false};
    r.fields((f, wt) => {
        if (f === 1 && wt === WT_LEN) batch.cells = packedVarints(r.bytes()).map(Number);
        else if (f === 2 && wt === WT_LEN) batch.varints = packedVarints(r.bytes()).map(signed64);
        else if (f === 3 && wt === WT_LEN) {
            const b = r.bytes();
            for (let i = 0; i + 8 <= b.length; i += 8) batch.doubles.push(b.readDoubleLE(i));
        } else if (f === 4 && wt === WT_LEN) { r.bytes(); batch.blobs++; }
        else if (f === 5 && wt === WT_LEN) batch.strings = r.bytes().toString('utf8').split('\0');
        else if (f === 6 && wt === WT_VARINT) batch.last = r.varint() !== 0n;
        else return false;
    });
    let vi = 0, di = 0, si = 0;
    for (const c of batch.cells) {
        let v;
        if (c === CELL_NULL) v = null;
        else if (c === CELL_VARINT) {
            const x = batch.varints[vi++];
            v = (x <= BigInt(Number.MAX_SAFE_INTEGER) && x >= BigInt(Number.MIN_SAFE_INTEGER)) ? Number(x) : x.toString();
        } else if (c === CELL_FLOAT64) v = batch.doubles[di++];
        else if (c === CELL_STRING) v = batch.strings[si++];
        else if (c === CELL_BLOB) v = '<blob>';
        else throw new Error(`unknown cell type ${c}`);
        if (q.row.length === 0) q.rows.push(q.row);
        q.row.push(v);
        if (q.row.length === q.columns.length) q.row = [];
    }
    return batch.last;
}

class Engine {
    constructor(uiDir) {
        this.seq = 0;
        this.rx = Buffer.alloc(0);
        this.pending = [];  // {kind, resolve, reject, query}
        this.stderr = [];
        const bundle = path.join(uiDir, 'engine_bundle.js');
        const wasm = path.join(uiDir, 'trace_processor.wasm');
        for (const f of [bundle, wasm]) {
            if (!fs.existsSync(f)) {
                const e = new Error(`${f} not found — run 'make perfetto-ui' (needs npm) first`);
                e.usage = true;
                throw e;
            }
        }
        const src = fs.readFileSync(bundle, 'utf8');
        const version = /VERSION = "([^"]+)"/.exec(src);
        this.version = version ? version[1] : 'unknown';
        // The bundle is a worker script: it talks to "self" and finds the wasm
        // file relative to the working directory (locateFile is the identity).
        // It runs in this realm (its instanceof checks must see the same
        // TypeError and Uint8Array as the WebAssembly objects it gets) with the
        // globals a worker script under node expects.
        const worker = {};
        Object.assign(globalThis, {self: worker, require, __dirname: uiDir, __filename: bundle});
        const log = console.log;
        console.log = () => {};
        console.warn = console.error = (l) => this.stderr.push(String(l));
        const cwd = process.cwd();
        process.chdir(uiDir);
        try {
            vm.runInThisContext(src, {filename: bundle});
        } finally {
            process.chdir(cwd);
            console.log = log;
        }
        const port = {
            set onmessage(fn) { this.deliver = fn; },
            postMessage: (data) => this.onBytes(Buffer.from(data)),
        };
        this.port = port;
        // The wasm module is instantiated synchronously while the bundle runs;
        // the bridge registers its reply callback in a promise continuation,
        // so one macrotask later it is ready for requests.
        this.ready = new Promise((resolve, reject) => setTimeout(() => {
            if (typeof worker.onmessage !== 'function')
                return reject(new Error(`${bundle} did not install a worker message handler`));
            worker.onmessage({data: {enginePort: port}});
            resolve();
        }, 0));
        this.wasmPath = wasm;
    }

    send(fields, kind, extra) {
        return new Promise((resolve, reject) => {
            this.pending.push(Object.assign({kind, resolve, reject}, extra || {}));
            const rpc = Buffer.concat([varintField(1, ++this.seq), ...fields]);
            const framed = lenField(1, rpc);  // TraceProcessorRpcStream.msg
            const cwd = process.cwd();
            // The wasm binary is read lazily, relative to the working directory.
            process.chdir(path.dirname(this.wasmPath));
            try {
                this.port.deliver({data: new Uint8Array(framed)});
            } catch (e) {
                reject(new Error(`trace processor aborted: ${e.message}`));
            } finally {
                process.chdir(cwd);
            }
        });
    }

    onBytes(buf) {
        this.rx = Buffer.concat([this.rx, buf]);
        for (;;) {
            const r = new Reader(this.rx);
            let payload;
            try {
                const t = Number(r.varint());
                if (t !== ((1 << 3) | WT_LEN)) throw new Error(`bad RPC frame tag ${t}`);
                payload = r.bytes();
            } catch (e) {
                if (/truncated/.test(e.message)) return;  // wait for more bytes
                throw e;
            }
            this.rx = this.rx.subarray(r.pos);
            this.onRpc(payload);
        }
    }

    onRpc(payload) {
        const r = new Reader(payload);
        let response = 0, fatal = '', appendError = '', queryResult = null;
        r.fields((f, wt) => {
            if (f === 3 && wt === WT_VARINT) response = Number(r.varint());
            else if (f === 5 && wt === WT_LEN) fatal = r.bytes().toString('utf8');
            else if (f === 201 && wt === WT_LEN) {
                const ar = new Reader(r.bytes());
                ar.fields((af, awt) => {
                    if (af === 2 && awt === WT_LEN) appendError = ar.bytes().toString('utf8');
                    else return false;
                });
            } else if (f === 203 && wt === WT_LEN) queryResult = r.bytes();
            else return false;
        });
        const p = this.pending[0];
        if (!p) throw new Error(`unexpected RPC response ${response}`);
        if (fatal) {
            this.pending.shift();
            return p.reject(new Error(`trace processor fatal error: ${fatal}`));
        }
        if (response === TPM_APPEND_TRACE_DATA || response === TPM_FINALIZE_TRACE_DATA) {
            this.pending.shift();
            return appendError ? p.reject(new Error(appendError)) : p.resolve();
        }
        if (response !== TPM_QUERY_STREAMING) throw new Error(`unexpected RPC response ${response}`);
        const q = p.query;
        let last = false;
        const qr = new Reader(queryResult || Buffer.alloc(0));
        qr.fields((f, wt) => {
            if (f === 1 && wt === WT_LEN) q.columns.push(qr.bytes().toString('utf8'));
            else if (f === 2 && wt === WT_LEN) q.error = qr.bytes().toString('utf8') || null;
            else if (f === 3 && wt === WT_LEN) last = decodeBatch(qr.bytes(), q) || last;
            else return false;
        });
        if (last || q.error) {
            this.pending.shift();
            p.resolve(q);
        }
    }

    async load(bytes) {
        const chunk = 16 * 1024 * 1024;
        for (let off = 0; off < bytes.length; off += chunk)
            await this.send([varintField(2, TPM_APPEND_TRACE_DATA),
                             lenField(101, bytes.subarray(off, off + chunk))], 'append');
        await this.send([varintField(2, TPM_FINALIZE_TRACE_DATA)], 'eof');
    }

    async query(sql) {
        const q = {sql, columns: [], rows: [], row: [], error: null};
        await this.send([varintField(2, TPM_QUERY_STREAMING), lenField(103, lenField(1, Buffer.from(sql)))],
                        'query', {query: q});
        delete q.row;
        return q;
    }
}

async function main() {
    const [uiDir, tracePath, ...queries] = process.argv.slice(2);
    if (!uiDir || !tracePath) {
        process.stderr.write('usage: perfetto_tp.js UI_DIR TRACE_FILE SQL...\n');
        return 2;
    }
    let engine;
    try {
        engine = new Engine(path.resolve(uiDir));
    } catch (e) {
        process.stderr.write(`perfetto_tp: ${e.message}\n`);
        return 2;
    }
    await engine.ready;
    const out = {perfetto_version: engine.version, load_error: null, results: []};
    let rc = 0;
    try {
        await engine.load(fs.readFileSync(tracePath));
    } catch (e) {
        out.load_error = e.message;
        rc = 1;
    }
    if (!out.load_error) {
        for (const sql of queries) {
            const q = await engine.query(sql);
            if (q.error) rc = 1;
            out.results.push(q);
        }
    }
    if (engine.stderr.length) out.stderr = engine.stderr.slice(-20);
    // A pipe is written asynchronously: exit only once it has taken it all.
    await new Promise((resolve) => process.stdout.write(JSON.stringify(out) + '\n', resolve));
    return rc;
}

main().then((rc) => process.exit(rc), (e) => {
    process.stderr.write(`perfetto_tp: ${e.stack || e}\n`);
    process.exit(1);
});
