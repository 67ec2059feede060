// suanli console: times into the browser's zone, the CSRF token on every htmx request, and the few behaviours a
// page's markup asks for by attribute (the pages' Content-Security-Policy allows no inline script or handler):
// data-confirm (ask before the button submits), data-print, data-autosubmit (a select submits its form).
(function () {
  function localTimes(root) {
    var fmt = new Intl.DateTimeFormat(document.documentElement.lang === "zh" ? "zh-CN" : "en-GB",
      { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit" });
    (root || document).querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (!isNaN(d)) { el.textContent = fmt.format(d); el.title = el.getAttribute("datetime"); }
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localTimes(document); });
  document.addEventListener("htmx:afterSwap", function (e) { localTimes(e.target); });
  document.addEventListener("htmx:configRequest", function (e) {
    var meta = document.querySelector('meta[name="csrf-token"]');
    if (meta) { e.detail.headers["X-CSRF-Token"] = meta.content; }
  });
  document.addEventListener("click", function (e) {
    var ask = e.target.closest && e.target.closest("[data-confirm]");
    if (ask && !window.confirm(ask.getAttribute("data-confirm"))) { e.preventDefault(); return; }
    if (e.target.closest && e.target.closest("[data-print]")) { window.print(); }
  });
  document.addEventListener("change", function (e) {
    if (e.target.matches && e.target.matches("select[data-autosubmit]") && e.target.form) { e.target.form.submit(); }
  });
  window.suanli = { localTimes: localTimes };
})();
