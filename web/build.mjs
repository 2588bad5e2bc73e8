// Bundles the dashboard (web/src) into OUTDIR/index.html, OUTDIR/app.js, OUTDIR/app.css.
//
//   node web/build.mjs OUTDIR [--node_modules DIR] [--no-minify]
//
// The packages (esbuild, uplot) come from --node_modules DIR, else the first NODE_PATH entry,
// else web/node_modules. CMake (cmake/WebAssets.cmake) installs them into the build tree with
// `npm ci --prefix BUILD/web` and passes --node_modules BUILD/web/node_modules, so the source
// tree stays clean. Nothing is fetched at run time: uPlot and its CSS are bundled.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const srcDir = path.join(here, 'src');

function usage(msg) {
  if (msg) console.error(`build.mjs: ${msg}`);
  console.error('usage: node web/build.mjs OUTDIR [--node_modules DIR] [--no-minify]');
  process.exit(2);
}

let outDir = null;
let nodeModules = null;
let minify = true;
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a === '--node_modules') {
    if (i + 1 >= args.length) usage('--node_modules needs a directory');
    nodeModules = args[++i];
  } else if (a.startsWith('--node_modules=')) {
    nodeModules = a.slice('--node_modules='.length);
  } else if (a === '--no-minify') {
    minify = false;
  } else if (a === '-h' || a === '--help') {
    usage();
  } else if (a.startsWith('-')) {
    usage(`unknown flag ${a}`);
  } else if (outDir === null) {
    outDir = a;
  } else {
    usage(`unexpected argument ${a}`);
  }
}
if (!outDir) usage('OUTDIR is required');
if (!nodeModules && process.env.NODE_PATH) {
  nodeModules = process.env.NODE_PATH.split(path.delimiter).find((p) => p) || null;
}
if (!nodeModules) nodeModules = path.join(here, 'node_modules');
nodeModules = path.resolve(nodeModules);
outDir = path.resolve(outDir);

if (!fs.existsSync(path.join(nodeModules, 'esbuild'))) {
  console.error(`build.mjs: no esbuild in ${nodeModules} (run npm ci there first)`);
  process.exit(1);
}
// Resolve esbuild from that directory, not from this file's location.
const requireFromModules = createRequire(path.join(nodeModules, '_varuna_build_.cjs'));
const esbuild = requireFromModules('esbuild');

fs.mkdirSync(outDir, { recursive: true });
let result;
try {
  result = await esbuild.build({
    entryPoints: { app: path.join(srcDir, 'app.js') },
    bundle: true,
    outdir: outDir,
    format: 'iife',
    target: 'es2020',
    platform: 'browser',
    minify,
    sourcemap: false,
    legalComments: 'none',
    nodePaths: [nodeModules],
    absWorkingDir: here,
    logLevel: 'warning',
    write: true,
  });
} catch (e) {
  // esbuild has printed the errors (logLevel).
  console.error(`build.mjs: esbuild failed (${e.errors ? e.errors.length : '?'} errors)`);
  process.exit(1);
}
if (result.errors.length) process.exit(1);

const html = fs.readFileSync(path.join(srcDir, 'index.html'), 'utf8');
fs.writeFileSync(path.join(outDir, 'index.html'), html);

for (const f of ['index.html', 'app.js', 'app.css']) {
  const p = path.join(outDir, f);
  if (!fs.existsSync(p)) {
    console.error(`build.mjs: ${p} was not produced`);
    process.exit(1);
  }
  console.log(`  ${f.padEnd(10)} ${fs.statSync(p).size} bytes`);
}
