// Run the site's own search worker (Material's lunr bundle) on its offline index, as a browser would from
// file://: load search/search_index.js as a script, start the worker, send one query, print the hits.
// usage: node site_search.js SITE_DIR "query"  →  JSON {docs: N, hits: [location, ...]}
const fs = require("fs"), vm = require("vm"), path = require("path");
const [site, query] = process.argv.slice(2);
const page = { console };
vm.createContext(page);
vm.runInContext(fs.readFileSync(path.join(site, "search", "search_index.js"), "utf8"), page);
const index = vm.runInContext("__index", page);
const dir = path.join(site, "assets", "javascripts", "workers");
const bundle = fs.readdirSync(dir).find((f) => /^search\.[0-9a-f]+\.min\.js$/.test(f));
const replies = [];
let handler = null;
const failing = { ...console, warn: (...a) => { console.error(...a); process.exit(1); } };
const worker = { console: failing, setTimeout, clearTimeout, importScripts: () => {},
  addEventListener: (type, fn) => { handler = fn; }, postMessage: (m) => replies.push(m) };
worker.self = worker;
vm.createContext(worker);
vm.runInContext(fs.readFileSync(path.join(dir, bundle), "utf8"), worker);
const settle = () => new Promise((r) => setTimeout(r, 20));
(async () => {
  handler({ data: { type: 0, data: { ...index, options: { suggest: false } } } });   // SETUP, as the page sends it
  await settle();
  handler({ data: { type: 2, data: query } });   // QUERY
  await settle();
  const result = replies.find((m) => m.type === 3);
  if (!replies.some((m) => m.type === 1) || !result) { console.error("worker did not answer"); process.exit(1); }
  console.log(JSON.stringify({ docs: index.docs.length, hits: result.data.items.map((group) => group[0].location) }));
})();
