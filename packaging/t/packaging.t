#!/usr/bin/perl

# Packaging checks, run by `make packaging-test` (part of `make test`):
#  - the Dockerfile's build stage builds only through Makefile targets, and they exist;
#  - `make install` with the build stage's arguments lays out every file the runtime stage
#    copies, and the files it copies from the build context exist and are not ignored;
#  - `make install DESTDIR=$(mktemp -d)` with the defaults lays out what the systemd unit
#    names (binary, environment file, user), the environment file only sets variables
#    yarl-root reads and starts it, and the installed module and its load_module snippet
#    load into the installed nginx together with the example configuration.
#
# Environment: PROFILE and TARGET_DIR as the Makefile's (the builds must exist: the target
# depends on `build` and `distro-module`); DISTRO_NGINX (default /usr/sbin/nginx).

use warnings;
use strict;

use Cwd qw(abs_path);
use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use IO::Socket::INET;
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep);

my $repo = abs_path(dirname(__FILE__) . '/../..');
chdir $repo or die "chdir $repo: $!\n";
delete @ENV{qw(MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES DESTDIR PREFIX MODULE)};
my $profile = $ENV{PROFILE} // 'debug';
my $target_dir = $ENV{TARGET_DIR} // "$repo/target";
my $nginx = $ENV{DISTRO_NGINX} // '/usr/sbin/nginx';
my @make = ('make', '--no-print-directory', "PROFILE=$profile", "TARGET_DIR=$target_dir");

sub slurp {
	my ($f) = @_;
	open my $fh, '<', $f or die "$f: $!\n";
	local $/;
	return scalar <$fh>;
}

sub run_cmd {
	my (@cmd) = @_;
	my $pid = open(my $fh, '-|') // die "fork: $!\n";
	if (!$pid) {
		open STDERR, '>&', \*STDOUT;
		exec @cmd or POSIX::_exit(127);
	}
	local $/;
	my $out = <$fh> // '';
	close $fh;
	return ($? >> 8, $out);
}

############################################################################
# The Makefile's targets, from make's own database.

my ($rc, $db) = run_cmd('make', '-pRrq', '-f', 'Makefile');
my %targets;
my $not_target = 0;
for my $line (split /\n/, $db) {
	if ($line =~ /^# Not a target/) { $not_target = 1; next }
	if ($line =~ /^([A-Za-z0-9][\w.\/-]*)\s*:(?![=:])/ && !$not_target) {
		$targets{$1} = 1;
	}
	$not_target = 0 if $line =~ /^\S/ && $line !~ /^#/;
}
ok($targets{$_}, "Makefile has target $_") for qw(deps build distro-module distro-test install test);

############################################################################
# The Dockerfile's stages.

my $dockerfile = slurp('Dockerfile');
$dockerfile =~ s/\\\n/ /g;    # continuation lines
my (@stages, $cur);
for my $line (split /\n/, $dockerfile) {
	next if $line =~ /^\s*(#|$)/;
	my ($instr, $rest) = $line =~ /^\s*(\w+)\s+(.*)$/ or next;
	$instr = uc $instr;
	if ($instr eq 'FROM') {
		my ($name) = $rest =~ /\bAS\s+(\S+)/i;
		push @stages, $cur = { name => $name // '', lines => [] };
		next;
	}
	push @{$cur->{lines}}, [$instr, $rest] if $cur;
}
my ($build) = grep { $_->{name} eq 'build' } @stages;
my $runtime = $stages[-1];
ok($build, 'Dockerfile has a build stage');
isnt($runtime, $build, 'the last stage is the runtime image');

my @make_calls;
for my $l (@{$build->{lines}}) {
	my ($instr, $cmd) = @$l;
	next unless $instr eq 'RUN';
	unlike($cmd, qr/(^|[\s;&|])cargo\s/, "build stage RUN builds through make only: $cmd");
	for my $part (split /&&|\|\||;|\|/, $cmd) {
		$part =~ s/^\s+//;
		next unless $part =~ /^make(\s|$)/;
		my @words = split /\s+/, $part;
		shift @words;
		my (@goals, %vars);
		for (my $i = 0; $i < @words; $i++) {
			my $w = $words[$i];
			if ($w =~ /^(\w+)=(.*)$/) { $vars{$1} = $2; next }
			if ($w =~ /^-[Cfj]$/) { $i++; next }
			next if $w =~ /^-/;
			push @goals, $w;
		}
		push @make_calls, { goals => \@goals, vars => \%vars, text => $part };
	}
}
ok(scalar @make_calls, 'build stage calls make');
for my $c (@make_calls) {
	ok(@{$c->{goals}}, "make call names its targets: $c->{text}");
	ok($targets{$_}, "build stage target '$_' exists in the Makefile") for @{$c->{goals}};
}
my ($install) = grep { grep { $_ eq 'install' } @{$_->{goals}} } @make_calls;
ok($install, 'build stage runs make install');
my %docker_vars = %{$install ? $install->{vars} : {}};
ok($docker_vars{DESTDIR}, "make install has a DESTDIR ($docker_vars{DESTDIR})") or BAIL_OUT('no DESTDIR');

############################################################################
# make install as the build stage runs it (our PROFILE: the build is the same otherwise).

my $stage = tempdir('yarl-pkg-XXXXXX', TMPDIR => 1, CLEANUP => 1);
my %vars = (%docker_vars, DESTDIR => $stage);
delete $vars{PROFILE};
($rc, my $out) = run_cmd(@make, 'install', map { "$_=$vars{$_}" } sort keys %vars);
is($rc, 0, 'make install with the Dockerfile\'s arguments') or diag($out);

my $dest = $docker_vars{DESTDIR};
$dest =~ s{/+$}{};
my (@from_build, @from_context);
for my $l (@{$runtime->{lines}}) {
	my ($instr, $rest) = @$l;
	next unless $instr eq 'COPY' || $instr eq 'ADD';
	my @w = split /\s+/, $rest;
	my @opts = grep { /^--/ } @w;
	my @paths = grep { !/^--/ } @w;
	pop @paths;    # destination
	if (grep { /^--from=build$/ } @opts) {
		push @from_build, @paths;
	} elsif (!grep { /^--from=/ } @opts) {
		push @from_context, @paths;
	}
}
ok(scalar @from_build, 'runtime stage copies from the build stage');
for my $p (@from_build) {
	like($p, qr{^\Q$dest\E/}, "COPY --from=build $p is under DESTDIR $dest");
	(my $local = $p) =~ s{^\Q$dest\E}{$stage};
	ok(-e $local, "make install lays out $p");
	ok(-x $local, "$p is executable") if $p =~ m{/bin/};
}
my @ignore = grep { /\S/ && !/^\s*#/ } split /\n/, slurp('.dockerignore');
for my $p (@from_context) {
	ok(-e $p, "build context has $p");
	my ($hit) = grep { my $g = $_; $g =~ s{/$}{}; $p =~ m{^\Q$g\E(/|$)} } @ignore;
	ok(!$hit, "$p is not excluded by .dockerignore");
}
my ($ep) = $dockerfile =~ /^ENTRYPOINT\s+\["([^"]+)"/m;
ok(grep({ m{/\Q$ep\E$} } @from_context), "ENTRYPOINT $ep is copied in");
($rc, $out) = run_cmd('sh', '-n', 'packaging/docker-entrypoint.sh');
is($rc, 0, 'docker-entrypoint.sh parses') or diag($out);
for my $must (qw(.git/ target/)) {
	ok((grep { $_ eq $must } @ignore), ".dockerignore excludes $must");
}

############################################################################
# make install with the defaults, and the systemd unit.

my $root = tempdir('yarl-inst-XXXXXX', TMPDIR => 1, CLEANUP => 1);
($rc, $out) = run_cmd(@make, 'install', "DESTDIR=$root");
is($rc, 0, 'make install DESTDIR=<tmp>') or diag($out);
my $unit_file = "$root/usr/local/lib/systemd/system/yarl-root.service";
ok(-f $unit_file, 'unit in PREFIX/lib/systemd/system') or BAIL_OUT('no unit');
my $unit = slurp($unit_file);
unlike($unit, qr/@\w+@/, 'no placeholders left in the unit');
my %u;
for (split /\n/, $unit) {
	push @{$u{$1}}, $2 if /^(\w+)=(.*)$/;
}
my ($exec) = split /\s+/, $u{ExecStart}[0];
is($exec, '/usr/local/bin/yarl-root', 'ExecStart is the installed binary');
ok(-x "$root$exec", "$exec installed and executable");
for my $ef (@{$u{EnvironmentFile} // []}) {
	(my $f = $ef) =~ s/^-//;
	ok(-f "$root$f", "EnvironmentFile $f installed");
}
ok($u{EnvironmentFile}, 'unit reads an EnvironmentFile');
my ($doc) = ($u{Documentation}[0] // '') =~ m{^file://(\S+)};
ok($doc && -f "$root$doc", "Documentation $doc installed");
my $user = $u{User}[0];
my $sysusers = slurp("$root/usr/local/lib/sysusers.d/yarl.conf");
like($sysusers, qr/^u\s+\Q$user\E\s/m, "sysusers.d creates the unit's user $user");
is($u{StateDirectory}[0], 'yarl', 'StateDirectory=yarl');

# systemd's own check of the unit (paths pointed into DESTDIR, where the files are).
SKIP: {
	my ($sa) = grep { -x } map { "$_/systemd-analyze" } split /:/, $ENV{PATH};
	skip 'no systemd-analyze', 1 unless $sa;
	(my $copy = $unit) =~ s{^(ExecStart|EnvironmentFile)=(-?)/}{$1=$2$root/}mg;
	open my $fh, '>', "$root/yarl-root.service" or die;
	print $fh $copy;
	close $fh;
	my ($vrc, $vout) = run_cmd($sa, 'verify', "$root/yarl-root.service");
	ok($vrc == 0 && $vout !~ /\S/, 'systemd-analyze verify: no complaints') or diag($vout);
}

my $envfile = "$root/etc/default/yarl-root";
is((stat $envfile)[2] & 07777, 0640, 'the env file is not world-readable (YARL_DB may hold a password)');
my %env;
for (split /\n/, slurp($envfile)) {
	next if /^\s*(#|$)/;
	ok(/^(\w+)=(.+)$/, "env file line is NAME=value: $_") and $env{$1} = $2;
}
my ($hrc, $help) = run_cmd("$root$exec", '--help');
my %known = map { $_ => 1 } $help =~ /\[env: (\w+)=/g;
ok(scalar keys %known, 'yarl-root --help lists its variables');
for my $k (sort keys %env) {
	ok($known{$k} || $k eq 'RUST_LOG', "env file sets a variable yarl-root reads: $k");
}
like($env{YARL_DB} // '', qr{^sqlite:///var/lib/yarl/}, 'default database in the StateDirectory');

# Start the installed binary with the env file's settings (database and address moved to
# the test's own: the unit's StateDirectory does not exist here).
{
	my $sock = IO::Socket::INET->new(Listen => 1, LocalAddr => '127.0.0.1', LocalPort => 0);
	my $port = $sock->sockport;
	close $sock;
	my $pid = fork() // die "fork: $!\n";
	if (!$pid) {
		%ENV = (%ENV, %env, YARL_DB => "sqlite://$root/yarl.db", YARL_LISTEN => "127.0.0.1:$port",
			NO_COLOR => 1);
		open STDOUT, '>', "$root/yarl-root.log";
		open STDERR, '>&', \*STDOUT;
		exec "$root$exec" or POSIX::_exit(127);
	}
	my $up = 0;
	for (1 .. 100) {
		my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 1);
		if ($s) {
			print $s "GET /healthz HTTP/1.0\r\n\r\n";
			local $/;
			my $r = <$s> // '';
			$up = $r =~ /"status":"ok"/;
			last;
		}
		sleep 0.1;
	}
	ok($up, 'the installed yarl-root starts with the env file\'s settings')
		or diag(slurp("$root/yarl-root.log"));
	kill 'TERM', $pid;
	waitpid($pid, 0);
	is($? >> 8, 0, 'and stops cleanly on SIGTERM');
}

############################################################################
# The installed module loads into the installed nginx through the installed snippet, with
# the example configuration.

SKIP: {
	skip "$nginx is not installed", 12 unless -x $nginx;
	my $snippet = "$root/usr/local/share/nginx/modules-available/mod-http-yarl.conf";
	my $enabled = "$root/etc/nginx/modules-enabled/50-mod-http-yarl.conf";
	ok(-l $enabled, 'module enabled in /etc/nginx/modules-enabled');
	is(readlink($enabled), '/usr/local/share/nginx/modules-available/mod-http-yarl.conf',
		'the link points at the installed snippet');
	my ($so) = slurp($snippet) =~ /^load_module\s+(\S+);/m;
	ok($so && -f "$root$so", "load_module $so is installed");
	my $d = tempdir('yarl-load-XXXXXX', TMPDIR => 1, CLEANUP => 1);
	my $example = slurp('packaging/nginx-yarl.conf');
	$example =~ s/listen 8080\b/listen 127.0.0.1:8080/g;
	my $user_line = $> == 0 ? "user root;\n" : '';
	open my $fh, '>', "$d/nginx.conf" or die;
	print $fh "load_module $root$so;\n${user_line}pid $d/nginx.pid;\nerror_log stderr notice;\n"
		. "events {}\nhttp {\n    access_log off;\n"
		. join('', map { "    ${_}_temp_path $d/$_;\n" } qw(client_body proxy fastcgi uwsgi scgi))
		. "$example\n}\n";
	close $fh;
	($rc, $out) = run_cmd($nginx, '-t', '-p', "$d/", '-c', "$d/nginx.conf");
	is($rc, 0, "$nginx -t loads the installed module with packaging/nginx-yarl.conf") or diag($out);

	# The Docker image's nginx configuration: Debian's stock /etc/nginx with the module
	# enabled the way the runtime stage does it, the entrypoint's 00-yarl-roots.conf and the
	# example site from the README's `docker run` line (system paths moved into $d).
	skip 'no stock /etc/nginx/nginx.conf', 8 unless -f '/etc/nginx/nginx.conf' && -d '/etc/nginx/conf.d';
	my $etc = "$d/etc-nginx";
	($rc, $out) = run_cmd('cp', '-a', '/etc/nginx', $etc);
	is($rc, 0, 'copy of /etc/nginx') or diag($out);
	run_cmd('sh', '-c', "rm -f $etc/modules-enabled/* $etc/conf.d/* && mkdir -p $d/log");
	my $conf = slurp("$etc/nginx.conf");
	$conf =~ s{/etc/nginx/}{$etc/}g;
	$conf =~ s{/var/log/nginx/}{$d/log/}g;
	$conf =~ s{^pid .*}{pid $d/nginx.pid;}m;
	open $fh, '>', "$etc/nginx.conf" or die;
	print $fh $conf;
	close $fh;
	my $modconf = slurp($snippet);
	$modconf =~ s{load_module\s+}{load_module $root};
	open $fh, '>', "$etc/modules-enabled/50-mod-http-yarl.conf" or die;
	print $fh $modconf;
	close $fh;
	# (nginx -t binds nothing: the stock site's `listen 80` stays as it is.)
	open $fh, '>', "$etc/conf.d/yarl.conf" or die;
	print $fh $example;
	close $fh;

	mkdir "$d/bin";
	open $fh, '>', "$d/bin/nginx" or die;
	print $fh "#!/bin/sh\necho \"nginx \$*\"\n";
	close $fh;
	chmod 0755, "$d/bin/nginx";
	open $fh, '>', "$d/sync.token" or die;
	print $fh "s3cret\n";
	close $fh;
	{
		local $ENV{PATH} = "$d/bin:$ENV{PATH}";
		local $ENV{YARL_NGINX_CONF_D} = "$etc/conf.d";
		local $ENV{YARL_ROOTS} = 'http://yarl-root-a:7700 http://yarl-root-b:7700';
		local $ENV{YARL_SYNC_INTERVAL} = '500ms';
		local $ENV{YARL_SYNC_TOKEN_FILE} = "$d/sync.token";
		($rc, $out) = run_cmd('packaging/docker-entrypoint.sh', 'nginx');
	}
	is($rc, 0, 'entrypoint runs nginx');
	like($out, qr/^nginx -g daemon off;\n\z/m, 'in the foreground');
	my $roots = slurp("$etc/conf.d/00-yarl-roots.conf");
	like($roots, qr{^yarl_roots http://yarl-root-a:7700 http://yarl-root-b:7700;$}m, 'yarl_roots from YARL_ROOTS');
	like($roots, qr{^yarl_sync_interval 500ms;$}m, 'yarl_sync_interval from YARL_SYNC_INTERVAL');
	like($roots, qr{^yarl_sync_token "s3cret";$}m, 'yarl_sync_token from YARL_SYNC_TOKEN_FILE');
	is((stat "$etc/conf.d/00-yarl-roots.conf")[2] & 07777, 0600, 'which only its owner can read');
	($rc, $out) = run_cmd($nginx, '-t', '-c', "$etc/nginx.conf");
	is($rc, 0, "the image's configuration passes $nginx -t") or diag($out);
	like($out, qr/test is successful/, 'nginx -t successful');
}

############################################################################
# The entrypoint's root role makes the tokens a root on 0.0.0.0 needs (once: the admin token
# in the data volume, the sync token in a volume of its own), the nginx role finds the sync
# token in that volume mounted at the same place, and other commands run as the user yarl.

{
	my $d = tempdir('yarl-ep-XXXXXX', TMPDIR => 1, CLEANUP => 1);
	mkdir "$d/bin";
	mkdir "$d/vol";
	mkdir "$d/sync";
	mkdir "$d/conf.d";
	for my $fake (qw(setpriv yarl-root nginx yarl-s3-app)) {
		open my $fh, '>', "$d/bin/$fake" or die;
		# Prints its arguments and the token variables it was given.
		print $fh "#!/bin/sh\necho \"$fake \$* admin=\${YARL_ADMIN_TOKEN_FILE:-} sync=\${YARL_SYNC_TOKEN_FILE:-}\"\n";
		close $fh;
		chmod 0755, "$d/bin/$fake";
	}
	local $ENV{PATH} = "$d/bin:$ENV{PATH}";
	local $ENV{YARL_TOKEN_DIR} = "$d/vol";
	local $ENV{YARL_SYNC_TOKEN_DIR} = "$d/sync";
	local $ENV{YARL_NGINX_CONF_D} = "$d/conf.d";
	delete local @ENV{qw(YARL_ADMIN_TOKEN_FILE YARL_SYNC_TOKEN_FILE YARL_INSECURE_NO_AUTH YARL_ROOTS)};

	($rc, $out) = run_cmd('packaging/docker-entrypoint.sh', 'yarl-root');
	is($rc, 0, 'root role runs yarl-root') or diag($out);
	my $run = $> == 0 ? 'setpriv --reuid=yarl --regid=yarl --init-groups yarl-root' : 'yarl-root';
	like($out, qr{^\Q$run\E\s+admin=\Q$d/vol/admin.token\E sync=\Q$d/sync/sync.token\E$}m,
		'with token files in the volumes when none are given');
	like($out, qr{admin token: \Q$d/vol/admin.token\E}, 'and says where the admin token is');
	like($out, qr{sync token: \Q$d/sync/sync.token\E}, 'and where the sync token is');
	my %file = (admin => "$d/vol/admin.token", sync => "$d/sync/sync.token");
	my %tok = map { $_ => slurp($file{$_}) } qw(admin sync);
	like($tok{$_}, qr/^[0-9a-f]{64}\n\z/, "$_ token: 64 random hex digits") for sort keys %tok;
	isnt($tok{admin}, $tok{sync}, 'two different tokens');
	is((stat $file{$_})[2] & 07777, 0640, "$_.token is not readable by others") for qw(admin sync);
	ok(!-e "$d/sync/admin.token" && !-e "$d/vol/sync.token", 'each token in its own volume only');

	($rc, $out) = run_cmd('packaging/docker-entrypoint.sh', 'yarl-root', '--poll-interval', '2s');
	is(slurp($file{$_}), $tok{$_}, "$_ token kept at the next start") for qw(admin sync);
	unlike($out, qr/created/, 'nothing created at the next start');
	like($out, qr{yarl-root --poll-interval 2s admin=}, 'arguments passed on');

	{
		local $ENV{YARL_ADMIN_TOKEN_FILE} = "$d/mine";
		($rc, $out) = run_cmd('packaging/docker-entrypoint.sh', 'yarl-root', '--sync-token-file', "$d/s");
		like($out, qr{ admin=\Q$d/mine\E sync=$}m, 'token files given by variable or flag are left alone');
	}
	unlink "$d/vol/admin.token", "$d/sync/sync.token";
	($rc, $out) = run_cmd('packaging/docker-entrypoint.sh', 'yarl-root', '--insecure-no-auth');
	like($out, qr{--insecure-no-auth admin= sync=$}m, '--insecure-no-auth: no tokens');
	{
		local $ENV{YARL_INSECURE_NO_AUTH} = 'true';
		($rc, $out) = run_cmd('packaging/docker-entrypoint.sh', 'yarl-root');
		like($out, qr{yarl-root\s+admin= sync=$}m, 'YARL_INSECURE_NO_AUTH=true: no tokens');
	}
	ok(!-e "$d/vol/admin.token" && !-e "$d/sync/sync.token", 'and no token files');

	($rc, $out) = run_cmd('packaging/docker-entrypoint.sh', 'yarl-s3-app', '--listen', ':8081');
	$run = $> == 0 ? 'setpriv --reuid=yarl --regid=yarl --init-groups yarl-s3-app' : 'yarl-s3-app';
	like($out, qr{^\Q$run\E --listen :8081 }m, 'another command runs as the user yarl');

	open my $fh, '>', "$d/sync/sync.token" or die;
	print $fh "abc123\n";
	close $fh;
	local $ENV{YARL_ROOTS} = 'http://127.0.0.1:7700';
	($rc, $out) = run_cmd('packaging/docker-entrypoint.sh', 'nginx');
	is($rc, 0, 'nginx role with the sync token\'s volume mounted') or diag($out);
	like(slurp("$d/conf.d/00-yarl-roots.conf"), qr{^yarl_sync_token "abc123";$}m,
		'takes the sync token from it');
	unlike($out, qr/warning/, 'no warning without the data volume');
	open $fh, '>', "$d/vol/admin.token" or die;
	close $fh;
	($rc, $out) = run_cmd('packaging/docker-entrypoint.sh', 'nginx');
	like($out, qr{warning: \Q$d/vol/admin.token\E is in this container}, 'the data volume mounted into nginx is warned about');
	unlink "$d/vol/admin.token";
	open $fh, '>', "$d/bad.token" or die;
	print $fh "a\"b\n";
	close $fh;
	local $ENV{YARL_SYNC_TOKEN_FILE} = "$d/bad.token";
	($rc, $out) = run_cmd('packaging/docker-entrypoint.sh', 'nginx');
	isnt($rc, 0, 'a token nginx cannot quote is refused');
	like($out, qr/has characters other than/, 'with a message');
	local $ENV{YARL_SYNC_TOKEN_FILE} = "$d/missing.token";
	local $ENV{YARL_TOKEN_WAIT} = 1;
	($rc, $out) = run_cmd('packaging/docker-entrypoint.sh', 'nginx');
	isnt($rc, 0, 'a missing YARL_SYNC_TOKEN_FILE fails after YARL_TOKEN_WAIT');
	like($out, qr/missing.token does not exist/, 'with a message');
}

done_testing();
