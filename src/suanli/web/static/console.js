// suanli console: times into the browser's zone, and the CSRF token on every htmx request.
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
  window.suanli = { localTimes: localTimes };
})();
