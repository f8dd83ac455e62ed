// people.js, loaded on first use (people mode only). Its own module rather than who.js, which
// people.js imports: no module imports one that imports it back (tests/ops/test_web_imports.py).
export const peopleModule = () => import('./people.js');
