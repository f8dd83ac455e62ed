// Applies the chosen theme before the first paint (no flash of the wrong colours).
// '' follows the system; 'light' or 'dark' is the manual switch (js/settings.js changes it).
try {
  const t = JSON.parse(localStorage.getItem('chat.settings.v1') || '{}').theme;
  if (t === 'light' || t === 'dark') document.documentElement.dataset.theme = t;
} catch { /* storage disabled: follow the system */ }
